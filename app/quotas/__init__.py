"""What one caller may cost the API: who the caller is, and the token buckets of its quotas."""
