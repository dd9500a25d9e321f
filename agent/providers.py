"""Request shapes of the providers, rendered from one history (agent/history.py). Pure.

Each provider has limits on the pictures a request may carry; an image is fitted to them when
it is read (toolsd's image.read downscales and re-encodes), so an oversized picture never
enters a request and fails every later one.
"""

from __future__ import annotations

PROVIDERS = ("anthropic", "openai", "gemini")

# Anthropic: 8000 px a side and 5 MB per image, 2000 px a side once a request holds more than
# 20 images. 5 MB is of the base64 text, hence 3.75 MB of bytes. 1568 px is Anthropic's own
# advice (larger images are downscaled by the API anyway, at the cost of latency).
_DEFAULT_DIM = 1568
_DEFAULT_BYTES = 3_750_000
_MANY_IMAGES = 20
_MANY_IMAGES_DIM = 2000


def image_limits(provider: str, images_in_request: int = 1) -> tuple[int, int]:
    """(max_dim, max_bytes) for one picture in a request of `provider` holding that many."""
    if provider not in PROVIDERS:
        raise ValueError(f"unknown provider {provider!r}; expected one of {', '.join(PROVIDERS)}")
    max_dim = _DEFAULT_DIM
    if images_in_request > _MANY_IMAGES:
        max_dim = min(max_dim, _MANY_IMAGES_DIM)
    return max_dim, _DEFAULT_BYTES
