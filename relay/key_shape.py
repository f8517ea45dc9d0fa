"""The shape of an API key, `relay_<key id>_<secret>`: how the server splits a key it is
sent (`relay.auth`), and how the recall hook names the key a run went with in its log
(`relay.hook.outcome_log.key_label`), by one rule.

Imports nothing: the hook imports it on every prompt, and `relay.auth` pulls in the store."""

PREFIX = "relay_"
KEY_ID_MAX = 64  # minted as 12 hex digits


def is_key_id(text: str) -> bool:
    """Whether `text` can be a key's id: 1 to 64 ASCII letters and digits."""
    return 0 < len(text) <= KEY_ID_MAX and text.isascii() and text.isalnum()


def split_key(token: str) -> tuple[str, str] | None:
    """`relay_<id>_<secret>` -> (id, secret); None when the shape is wrong (a secret is
    minted as 32 characters, and is never shorter than 16)."""
    if not token.startswith(PREFIX):
        return None
    key_id, sep, secret = token[len(PREFIX) :].partition("_")
    if not sep or not is_key_id(key_id) or len(secret) < 16:
        return None
    return key_id, secret
