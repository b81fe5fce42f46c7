"""Caller authentication of NotificationService: bearer credentials (API keys and JWTs) checked in the
order of docs/callers.md#who-may-call, and the key sets they are checked against. No web framework:
the transports (app/api/auth_http.py, app/api/auth_grpc.py) hand in the headers and answer."""
