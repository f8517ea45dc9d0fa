"""Secret detection: which kinds of secret-shaped content a text holds.

Deliberately two-tiered. Provider formats (GitHub, AWS, Stripe, ...) are matched by
shape and flagged wherever they appear. Generic assignments (`password = ...`,
`api_key: ...`) are flagged only when the value looks like a literal credential:
placeholders (`<your-key>`, `***`, `changeme`) and references (`${VAR}`, `$VAR`,
`os.environ[...]`, `process.env.X`, `op://...`) are how a team *should* write about
secrets, and prose ("rotate the API key monthly") has no assignment at all. A quoted run
of words is a passphrase only where a password goes and only without the words a hint or
a label is made of. A command's password slot (`curl -u user:...`, `mysql -p...`) is
judged like an assignment. Text is matched as it reads: without invisible format
characters, NFKC-folded. Pure and stdlib-only; `relay.hygiene` turns a finding into the
write's refusal.
"""

from __future__ import annotations

import base64
import math
import re
import unicodedata
from collections.abc import Callable


def find_secrets(text: str) -> list[str]:
    """The kinds of secret-shaped content in `text`, in order of first appearance.

    Only kind names are returned (e.g. "github token"), never the matched text, so the
    result is safe to log and to put in an error message.
    """
    text = _as_read(text)
    hits: list[tuple[int, str]] = []
    claimed: list[tuple[int, int]] = []
    for kind, pattern, accept in _PROVIDER_PATTERNS:
        for m in pattern.finditer(text):
            if any(s < m.end() and m.start() < e for s, e in claimed):
                continue  # e.g. a JWT inside an Authorization header counts once
            value = m.group("v") if "v" in pattern.groupindex else m.group(0)
            if accept is None or accept(value):
                hits.append((m.start(), kind))
                claimed.append(m.span())
    for pattern, kind_of, judge in _ASSIGNMENT_PATTERNS:
        for m in pattern.finditer(text):
            start, end = m.span("v")
            if any(s < end and start < e for s, e in claimed):
                continue  # already reported as a specific kind, e.g. GITHUB_TOKEN=ghp_...
            key = m.group("k") if "k" in pattern.groupindex else ""
            value, quoted = _unquote(m.group("v"))
            if judge(value, quoted, key):
                hits.append((m.start(), kind_of(key)))
    seen: dict[str, None] = {}
    for _, kind in sorted(hits):
        seen.setdefault(kind, None)
    return list(seen)


def _as_read(text: str) -> str:
    """`text` as a reader (or a model) takes it in: without invisible format characters
    (zero-width spaces and joiners, bidi marks, tag characters) and with compatibility forms
    folded (NFKC: full-width `ｇｈｐ＿` is `ghp_`), so a token cannot dodge a pattern by them."""
    if text.isascii():
        return text
    visible = "".join(ch for ch in text if unicodedata.category(ch) != "Cf")
    return unicodedata.normalize("NFKC", visible)


def _entropy(value: str) -> float:
    """Shannon entropy in bits per character."""
    if not value:
        return 0.0
    counts: dict[str, int] = {}
    for ch in value:
        counts[ch] = counts.get(ch, 0) + 1
    n = len(value)
    return -sum(c / n * math.log2(c / n) for c in counts.values())


def _has_letter_and_digit(value: str) -> bool:
    return any(c.isalpha() for c in value) and any(c.isdigit() for c in value)


def _random_looking(value: str) -> bool:
    """A token that mixes letters and digits with enough spread to be generated, not written."""
    return _has_letter_and_digit(value) and _entropy(value) >= 3.0


def _not_example(value: str) -> bool:
    # AWS documents its example credentials with EXAMPLE in them (AKIAIOSFODNN7EXAMPLE).
    return "EXAMPLE" not in value.upper()


def _random_not_example(value: str) -> bool:
    return _random_looking(value) and _not_example(value)


def _relay_key(value: str) -> bool:
    # relay_<key id>_<secret> (relay.auth.mint_key): a short alphanumeric id, then a long
    # url-safe random secret that may itself contain `_` and `-`.
    key_id, _, secret = value[len("relay_") :].partition("_")
    return (
        4 <= len(key_id) <= 32
        and key_id.isalnum()
        and len(secret) >= 16
        and _random_looking(key_id + secret)
    )


# The storage emulator's (Azurite's) account key, published by Microsoft for local use.
_AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


def _azure_key(value: str) -> bool:
    return value != _AZURITE_KEY and _random_not_example(value)


def _encoded_private_key(value: str) -> bool:
    """Whether base64 text that opens as an encoded `-----BEGIN ` says PRIVATE KEY next."""
    head = value[: min(len(value), 120) // 4 * 4]
    return b"PRIVATE KEY" in base64.b64decode(head)


_NOT_TOKEN = r"(?<![A-Za-z0-9_-])"
_PROVIDER_PATTERNS: tuple[tuple[str, re.Pattern[str], Callable[[str], bool] | None], ...] = (
    (
        # Three dashes or more on either side: a header copied with one dash lost (or a
        # space added) still opens a private key.
        "private key",
        re.compile(r"---[ \t]?BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?[ \t]?---"),
        None,
    ),
    (
        # PuTTY's .ppk: the header, then (a few short lines later) the private blob.
        "private key",
        re.compile(
            r"PuTTY-User-Key-File-\d{1,2}:[^\n]{0,200}\n(?:[^\n]{0,200}\n){0,40}?"
            r"Private-Lines:[ \t]*\d"
            r"|Private-Lines:[ \t]*\d{1,3}[ \t]*\n[ \t]*[A-Za-z0-9+/]{40,}"
        ),
        None,
    ),
    (
        # A PEM file base64-encoded whole, as kubeconfig's client-key-data and a Kubernetes
        # secret's tls.key hold it: `LS0tLS1CRUdJTi` is `-----BEGIN ` encoded.
        "private key",
        re.compile(r"(?<![A-Za-z0-9+/])LS0tLS1CRUdJTi[A-Za-z0-9+/]{40,}"),
        _encoded_private_key,
    ),
    (
        "aws access key id",
        re.compile(
            r"(?<![A-Za-z0-9])(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AIPA|ANPA|ANVA|APKA|AROA)"
            r"[A-Z0-9]{16}(?![A-Za-z0-9])"
        ),
        _not_example,
    ),
    (
        "aws secret access key",
        re.compile(
            r"(?i)secret_?access_?key[\"']?\s{0,4}(?:=|:)\s{0,4}[\"']?"
            r"(?P<v>(?-i:[A-Za-z0-9/+]{40}))(?![A-Za-z0-9/+=])"
        ),
        _random_not_example,
    ),
    ("github token", re.compile(_NOT_TOKEN + r"gh[pousr]_[A-Za-z0-9]{30,}"), _random_looking),
    ("github token", re.compile(_NOT_TOKEN + r"github_pat_[A-Za-z0-9_]{30,}"), _random_looking),
    # Every kind GitLab prefixes (personal, deploy, runner, job, trigger, feed, agent, OAuth
    # application...), and the legacy runner registration token's fixed prefix.
    (
        "gitlab token",
        re.compile(
            _NOT_TOKEN + r"(?:gl(?:pat|dt|rt|rtr|cbt|ptt|ft|imt|agent|oas|soat|ffct|wt)-"
            r"|GR1348941)[A-Za-z0-9_-]{20,}"
        ),
        _random_looking,
    ),
    ("slack token", re.compile(_NOT_TOKEN + r"xox[abprs]-[A-Za-z0-9-]{10,}"), _random_looking),
    # An app-level token (Socket Mode): xapp-<version>-<app id>-<number>-<secret>.
    ("slack token", re.compile(_NOT_TOKEN + r"xapp-\d-[A-Za-z0-9-]{20,}"), _random_looking),
    (
        "slack webhook",
        re.compile(r"hooks\.slack\.com/services/T[A-Z0-9]{6,}/B[A-Z0-9]{6,}/[A-Za-z0-9]{16,}"),
        None,
    ),
    (
        # Workflow Builder's webhooks: whoever holds the URL starts the workflow.
        "slack webhook",
        re.compile(
            r"hooks\.slack\.com/(?:workflows|triggers)/T[A-Z0-9]{6,}(?:/[A-Za-z0-9]{1,40}){1,2}"
            r"/[A-Za-z0-9]{16,}"
        ),
        None,
    ),
    ("stripe key", re.compile(_NOT_TOKEN + r"[sr]k_live_[A-Za-z0-9]{16,}"), _random_looking),
    # A webhook endpoint's signing secret: with it anyone can forge Stripe's events.
    ("stripe key", re.compile(_NOT_TOKEN + r"whsec_[A-Za-z0-9+/]{24,}"), _random_looking),
    ("anthropic api key", re.compile(_NOT_TOKEN + r"sk-ant-[A-Za-z0-9_-]{20,}"), _random_looking),
    (
        "openai api key",
        re.compile(_NOT_TOKEN + r"sk-(?!ant-)(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}"),
        _random_looking,
    ),
    ("google api key", re.compile(_NOT_TOKEN + r"AIza[0-9A-Za-z_-]{35}"), None),
    (
        "google oauth client secret",
        re.compile(_NOT_TOKEN + r"GOCSPX-[A-Za-z0-9_-]{24,40}(?![A-Za-z0-9_-])"),
        _random_looking,
    ),
    ("google oauth token", re.compile(_NOT_TOKEN + r"ya29\.[A-Za-z0-9_.-]{30,}"), _random_looking),
    (
        "sendgrid api key",
        re.compile(_NOT_TOKEN + r"SG\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}(?![A-Za-z0-9_-])"),
        _random_looking,
    ),
    (
        "shopify token",
        re.compile(_NOT_TOKEN + r"shp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}(?![A-Za-z0-9])"),
        _random_looking,
    ),
    (
        "digitalocean token",
        re.compile(_NOT_TOKEN + r"do[opr]_v1_[a-f0-9]{64}(?![A-Za-z0-9])"),
        _random_looking,
    ),
    # Twilio's API key sid; lower-case hex, as Twilio writes it (an upper-case hex digest
    # after "SK" is more likely a SKU or a hash).
    ("twilio api key", re.compile(_NOT_TOKEN + r"SK[0-9a-f]{32}(?![A-Za-z0-9])"), _random_looking),
    (
        "azure storage key",
        re.compile(
            r"(?i)(?<![A-Za-z0-9])(?:AccountKey|SharedAccessKey)[ \t]{0,2}=[ \t]{0,2}"
            r"(?P<v>[A-Za-z0-9+/]{20,}={0,2})"
        ),
        _azure_key,
    ),
    (
        "azure sas token",
        re.compile(
            r"(?<![A-Za-z0-9])sv=\d{4}-\d\d-\d\d[^\s\"'<>]{0,400}?[?&;]sig="
            r"(?P<v>[A-Za-z0-9%+/=]{30,})"
        ),
        _random_looking,
    ),
    (
        "jwt",
        re.compile(_NOT_TOKEN + r"eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}"),
        None,
    ),
    ("npm token", re.compile(_NOT_TOKEN + r"npm_[A-Za-z0-9]{36}(?![A-Za-z0-9])"), _random_looking),
    # Docker Hub's personal and organisation access tokens (`docker login -p ...`).
    (
        "docker hub token",
        re.compile(_NOT_TOKEN + r"dckr_(?:pat|oat)_[A-Za-z0-9_-]{20,}"),
        _random_looking,
    ),
    ("pypi token", re.compile(_NOT_TOKEN + r"pypi-AgE[A-Za-z0-9_-]{50,}"), None),
    (
        "hugging face token",
        re.compile(_NOT_TOKEN + r"hf_[A-Za-z0-9]{34}(?![A-Za-z0-9])"),
        _random_looking,
    ),
    ("relay api key", re.compile(r"(?<![A-Za-z0-9_])relay_[A-Za-z0-9_-]{24,}"), _relay_key),
    (
        "password in url",
        re.compile(
            r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]{0,20}://"
            r"[^\s/:@'\"<>]{0,256}:(?P<v>[^\s/@'\"<>]{1,256})@[A-Za-z0-9\[]"
        ),
        lambda v: not _is_placeholder_or_reference(v),
    ),
    (
        "authorization header",
        re.compile(
            r"(?i)authorization[\"']?\s{0,4}[:=]\s{0,4}[\"']?(?:bearer|basic|token)\s+"
            r"(?P<v>[A-Za-z0-9._~+/=-]{16,})"
        ),
        _random_looking,
    ),
)

# A key that *ends* with one of these words, then `=`, `:`, `:=` or `=>`, then a value.
# The key must start at an identifier boundary and is length-bounded, which keeps the scan
# linear on long runs of identifier characters.
_KEYWORDS = (
    # `pass` as a word of its own (DB_PASS, db-pass, dbPass, pass), not bypass or compass.
    r"password|passwd|passphrase|pwd|(?<![a-z0-9])pass|(?-i:(?<=[a-z0-9])Pass)"
    r"|secret|token|api[_ -]?key|apikey"
    r"|(?:access|private|secret|signing|encryption|master)[_-]?key|credentials?"
    r"|secret[_-]?key[_-]base"  # Rails signs and encrypts its cookies with secret_key_base
)
# `password: str = "..."`: a typed declaration assigns after the annotation.
_TYPE_ANNOTATION = r":[ \t]{0,4}[A-Za-z_][\w.\[\]| ]{0,40}?[ \t]{0,4}="
_VALUE = r"(?P<v>\"[^\"\n]{0,512}\"|'[^'\n]{0,512}'|`[^`\n]{0,512}`|[^\s,;'\"`]{1,512})"
_ASSIGNMENT = re.compile(
    r"(?i)(?<![A-Za-z0-9_.-])(?P<k>[A-Za-z0-9_.-]{0,64}?(?:" + _KEYWORDS + r"))"
    r"[\"']?[ \t]{0,4}(?:" + _TYPE_ANNOTATION + r"|:=|=>|=|:)[ \t]{0,4}" + _VALUE
)
_CLI_FLAG = re.compile(
    r"(?i)(?<![A-Za-z0-9_-])--(?P<k>password|passwd|passphrase|token|api-key|secret|client-secret)"
    r"[ \t]+" + _VALUE
)

# An environment variable named like a credential, `STRIPE_KEY=...` (upper case, as env
# files and shell exports write them). `key` alone names too much (cache, sort, primary,
# partition keys), so the value must be a long random string besides.
_ENV_KEY = re.compile(
    r"(?<![A-Za-z0-9_])(?P<k>[A-Z][A-Z0-9_]{0,62}_KEY)[\"']?[ \t]{0,4}(?:=|:)[ \t]{0,4}" + _VALUE
)
_KEY_MATERIAL = re.compile(r"(?:base64:)?[A-Za-z0-9+/_-]{20,}={0,2}")  # base64, hex, url-safe
_SEPARATORS = re.compile(r"[/_-]")
_UUID = re.compile(r"[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}")


def _env_key_value(value: str, quoted: bool, key: str) -> bool:
    if any(word in key for word in ("PUBLIC", "PUBLISHABLE")) or _UUID.fullmatch(value):
        return False
    if not _KEY_MATERIAL.fullmatch(value) or not _random_looking(value):
        return False  # a name (`session:abc123`), a file (`db.sql.gz`), a word
    if value.lower() in (value, value.swapcase()) and max(map(len, _SEPARATORS.split(value))) <= 12:
        return False  # a path or a name (`uploads/2024/q1`, `user_profile_v2`), in short words
    return _looks_like_literal_secret(value, quoted, key)


def _assignment_kind(key: str) -> str:
    key = key.lower()
    if key.endswith(("password", "passwd", "passphrase", "pwd", "pass")):
        return "password assignment"
    if key.endswith("token"):
        return "token assignment"
    if re.search(r"api[_ -]?key$", key):
        return "api key assignment"
    return "secret assignment"


# A password given on a command line, in the one slot the command has for it:
# `curl -u user:pass` (or --user), `mysql -pPASS` (no space: `-p pass` prompts, and
# `pass` is the database), `sshpass -p pass`. The line is cut at a pipe or `;`/`&`.
_COMMAND_LINE = r"(?=[ \t])[^\n|;&]{0,400}?[ \t]"  # the rest of the line up to the flag
_CURL_USER = re.compile(
    r"(?<![\w-])curl(?:\.exe)?" + _COMMAND_LINE + r"(?:-[A-Za-z]{0,5}u[ \t]*|--user[ \t=]+)"
    r"[\"']?[^\s:\"'`$<>{}()]{1,128}:(?P<v>[^\s\"'`]{1,256})"
)
_MYSQL_PASSWORD = re.compile(
    r"(?<![\w-])(?:mysql|mysqldump|mysqladmin|mysqlimport|mysqlcheck|mysqlsh|mariadb"
    r"|mariadb-dump)" + _COMMAND_LINE + r"-p" + _VALUE
)
_SSHPASS = re.compile(r"(?<![\w-])sshpass" + _COMMAND_LINE + r"-p[ \t]*" + _VALUE)


def _command_kind(_: str) -> str:
    return "password in command"


def _written_password(value: str, quoted: bool, key: str) -> bool:
    """A value in a slot that only ever holds a password: judged as a quoted one would be
    (any digit or symbol makes it literal), since it cannot be an expression; quoted words
    (`-p'S3cret Pass!'`) are one when a digit or symbol is among them."""
    if quoted and any(not ch.isalpha() and not ch.isspace() for ch in value):
        if any(ch.isspace() for ch in value) and _passphrase(value, 2):
            return True
    return _looks_like_literal_secret(value, True, "password")


# Values that stand in for a secret rather than being one.
_PLACEHOLDER_WORDS = frozenset(
    """changeme change_me change-me password passwd secret secrets token apikey api_key api-key
    example placeholder redacted none null nil undefined true false todo tbd dummy test testing
    string str required optional sample hidden masked empty default unset notset not_set
    1password base64 sha256 sha512 hs256 rs256 es256 oauth2 utf8 utf-8 uuid4""".split()
)
_PLACEHOLDER_PARTS = tuple(
    "your example placeholder redacted changeme change_me change-me replace dummy fake"
    " xxxx *** ... … < >".split()
)
# Ways of pointing at where a secret lives: environment, secret stores, templating.
_REFERENCE = re.compile(
    r"^(?:\$|%|\{|\[|@)"  # ${VAR} $VAR $(cmd) %(name)s {{ var }} {var} [secret] @var
    r"|environ|getenv|process\.env|import\.meta\.env|\benv\b|secrets\.|\bvault\b"
    r"|\bssm\b|secretsmanager|keyring|keychain|^op://|^vault:|^aws:|^gcp:|^azure:",
    re.IGNORECASE,
)


def _unquote(raw: str) -> tuple[str, bool]:
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "\"'`":
        return raw[1:-1], True
    value = raw.rstrip(".:!?)]}")
    if "..." in raw[len(value) :]:
        # Cut short (`ANTHROPIC_API_KEY=sk-ant-api03-...`), not ended by a full stop: the
        # ellipsis stays, so the value is a stand-in, as it is quoted (`"sk-..."`).
        value += "..."
    return value, False


def _is_placeholder_or_reference(value: str) -> bool:
    lowered = value.lower()
    if lowered in _PLACEHOLDER_WORDS or _REFERENCE.search(value):
        return True
    if any(part in lowered for part in _PLACEHOLDER_PARTS):
        return True
    # Masks such as ******** / xxxxxxxx / •••••• / 000000.
    return len(set(lowered)) <= 1


# Words a sentence, a label or a hint uses, and a random passphrase almost never does:
# `password: "see the vault"`, `"password": "Mot de passe"` are no passphrases.
_PROSE_WORDS = frozenset(
    """a an the and or not no nor but if then than so as at by for from in into of on to
    with without via per is are was were be been it its this that these those there here
    your my our their his her you we they i me us them see use used using set get read ask
    stored store kept keep lives live same above below any some none empty value variable
    file env environment vault manager secret secrets password passwords passphrase key
    keys token tokens credential credentials required optional enter type must should can
    will do does new old confirm current forgot reset invalid wrong min max least most
    characters chars de la le les des du et un une der die das und ein eine el los las y en
    il di da""".split()
)


def _passphrase(value: str, min_words: int) -> bool:
    """Several plain words that make a passphrase ("correct horse battery staple"), not a
    sentence or a label: no word of one (_PROSE_WORDS), nothing standing in for a secret."""
    words = [w.strip(".,;:!?()\"'").lower() for w in value.split()]
    return (
        min_words <= len(words) <= 10
        and all(0 < len(w) <= 24 for w in words)
        and not any(w in _PROSE_WORDS for w in words)
        and not _is_placeholder_or_reference(value)
    )


def _passphrase_words(key: str) -> int | None:
    """How many words, quoted, make a passphrase of a value assigned to `key` (None: none)."""
    key = key.lower()
    if key.endswith("passphrase"):
        return 3
    if key.endswith(("password", "passwd", "pass")):
        return 4  # a label ("Passwort erneut eingeben") is rarely four words without one
    return None


def _looks_like_literal_secret(value: str, quoted: bool, key: str = "") -> bool:
    """Whether an assigned value is a credential written out, not prose, code or a stand-in."""
    if len(value) < 6 or value.isdigit():
        return False
    if any(ch.isspace() for ch in value):
        min_words = _passphrase_words(key)
        return quoted and min_words is not None and _passphrase(value, min_words)
    if _is_placeholder_or_reference(value):
        return False
    if "://" in value or value.startswith(("/", "./", "../", "~/")):
        return False  # a URL or a path says where, not what (credentials in URLs are found apart)
    if not quoted:
        # Unquoted values in code are usually expressions (`z.string().min(8)`, `req.headers.x`);
        # literal config values (`.env`, YAML) mix letters and digits.
        if any(ch in value for ch in "()[]{}<>"):
            return False
        return _has_letter_and_digit(value)
    has_symbol = any(not ch.isalnum() and ch not in "-_./" for ch in value)
    return (
        any(ch.isdigit() for ch in value)
        or has_symbol
        or (len(value) >= 16 and _entropy(value) >= 3.3)
    )


_ASSIGNMENT_PATTERNS: tuple[
    tuple[re.Pattern[str], Callable[[str], str], Callable[[str, bool, str], bool]], ...
] = (
    (_ASSIGNMENT, _assignment_kind, _looks_like_literal_secret),
    (_CLI_FLAG, _assignment_kind, _looks_like_literal_secret),
    (_ENV_KEY, _assignment_kind, _env_key_value),
    (_CURL_USER, _command_kind, _written_password),
    (_MYSQL_PASSWORD, _command_kind, _written_password),
    (_SSHPASS, _command_kind, _written_password),
)
