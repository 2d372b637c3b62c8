"""OpenAI-style errors: ``{"error": {"message", "type", "param", "code"}}`` with an HTTP status."""

from __future__ import annotations

from engine.errors import (
    ContextFullError,
    ContextLengthError,
    ConversationError,
    HearthError,
    ModelFileError,
    ModelNotFoundError,
    ModelNotLoadedError,
    ModelTooLargeError,
    PromptError,
    ProviderError,
)

# HTTP status → OpenAI's error type for it
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 405: "invalid_request_error", 413: "invalid_request_error", 415: "invalid_request_error",
               421: "permission_error", 429: "rate_limit_error", 500: "server_error", 503: "service_unavailable"}


class ApiError(Exception):
    """A request the server answers with an error status and a message for the client's developer."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return error_body(self.status, self.message, self.param, self.code)


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": code}}


def from_engine(exc: HearthError, prompt_param: str | None = None) -> ApiError:
    """The status an engine failure is answered with: the client's input (400), an unknown model (404),
    a model that cannot be loaded or is not loaded (503), anything else the server's fault (500).
    ``prompt_param``: the field that holds the prompt ("messages", "prompt"), named when it is too long."""
    if isinstance(exc, ModelNotFoundError):
        return ApiError(404, str(exc), param="model", code="model_not_found")
    if isinstance(exc, ContextLengthError | ContextFullError):  # the code OpenAI's clients look for
        return ApiError(400, str(exc), param=prompt_param, code="context_length_exceeded")
    if isinstance(exc, PromptError | ConversationError):
        return ApiError(400, str(exc), code="invalid_prompt" if isinstance(exc, PromptError) else "invalid_request")
    if isinstance(exc, ModelNotLoadedError | ModelFileError | ModelTooLargeError | ProviderError):
        return ApiError(503, str(exc), param="model", code="model_not_available")
    return ApiError(500, str(exc), code="engine_error")
