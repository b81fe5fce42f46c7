"""The legacy push API (`notifications.v1.Notifications`) as a source: its topics, messages,
eligibility and payloads. Contract: docs/legacy.md."""
