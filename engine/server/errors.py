"""The server's errors: OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, and on the
Anthropic endpoints (``/v1/messages*``) Anthropic's, ``{"type": "error", "error": {"type", "message"}}``,
whoever raised them (a route, a guard, FastAPI's own 404/405)."""

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


# HTTP status → Anthropic's error type; a status Anthropic does not use is answered as the one it would use
ANTHROPIC_PREFIX = "/v1/messages"
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
                   529: "overloaded_error"}
# statuses of ours that Anthropic has no word for: the one it would answer with
ANTHROPIC_STATUS = {405: 404, 415: 400, 421: 403, 499: 400, 503: 500}
OVERLOADED_CODES = {"shutting_down"}  # a 503 that is temporary: Anthropic's 529 overloaded_error


def anthropic_path(path: str) -> bool:
    """Whether ``path`` is one of the Anthropic Messages API's (its errors take Anthropic's shape)."""
    return path == ANTHROPIC_PREFIX or path.startswith(ANTHROPIC_PREFIX + "/")


def anthropic_status(status: int, code: str | None = None) -> int:
    if status == 503 and code in OVERLOADED_CODES:
        return 529
    return ANTHROPIC_STATUS.get(status, status)


def anthropic_error_body(status: int, message: str) -> dict:
    """Anthropic's error object for a status already mapped by ``anthropic_status``."""
    kind = ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def shaped(path: str, status: int, message: str, param: str | None = None,
           code: str | None = None) -> tuple[int, dict]:
    """(status, body) for an error on ``path``: Anthropic's shape on its endpoints, else OpenAI's."""
    if anthropic_path(path):
        status = anthropic_status(status, code)
        return status, anthropic_error_body(status, message)
    return status, error_body(status, message, param, code)


class ApiError(Exception):
    """A request the server answers with an error status and a message for the client's developer."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return error_body(self.status, self.message, self.param, self.code)

    def shaped(self, path: str) -> tuple[int, dict]:
        """(status, body) as ``path``'s API answers it."""
        return shaped(path, self.status, self.message, self.param, self.code)


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
