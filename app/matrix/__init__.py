"""The Matrix push gateway: a source that answers homeservers in the same request."""
