"""The one error shape of the HTTP routes: `{"error": {"message", "type", "code"}}`."""

from __future__ import annotations

CLIENT_CLOSED_REQUEST = 499  # nginx's status for a client that hung up before the answer

ERROR_TYPES = {401: "authentication_error", 404: "not_found_error"}


class APIError(Exception):
    """An error answered as `{"error": {"message", "type", "code"}}` with HTTP `status`."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def error_body(status: int, message: str) -> dict:
    fallback = "invalid_request_error" if status < 500 else "internal_error"
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, fallback),
                      "code": status}}
