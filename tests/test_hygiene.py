"""Write hygiene: every rejection a memory write can meet, and what must pass untouched."""

from __future__ import annotations

import base64
import json
import random
import re
import string
import time
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from relay import hygiene
from relay.errors import InvalidRequestError, SecretDetectedError, TooLargeError
from relay.hygiene import (
    MAX_BODY_CHARS,
    check_audiences,
    check_body,
    check_source,
    check_tags,
    check_title,
    check_valid_until,
)
from relay.secret_scan import find_secrets

BENCH = Path(__file__).resolve().parents[1] / ".." / "shared" / "bench"
NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)

# Test credentials are assembled from pieces so that no scanner mistakes this file for a leak.
GITHUB = "gh" + "p_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
AWS_ID = "AK" + "IA" + "Q3EGRIB7ZK4XN2UF"
AWS_SECRET = "k9Xs/2LpQ+7hTz4vWm1NcR8yB3eJdF6uA0gHiKoP"
JWT = (
    "ey" + "JhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0."
    "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
)
AZURE_KEY = "pU3KGCUwux1tEyze1iN7LtkeP3IfyxlxF0SU1kk8nVw0YL4xIB5p/" + (
    "tqg7ui5mX9cfCmZ/a/lkyU81lSvTfrXFA=="
)
PUTTY = """PuTTY-User-Key-File-3: ssh-rsa
Encryption: none
Comment: deploy@ci
Public-Lines: 2
AAAAB3NzaC1yc2EAAAADAQABAAABAQC7vbqajDhA8cNx2m0dVKjgx7z3Kq9Lm2Vn7R
t4Wy8Bc1Df6Gh0Jk5pQ3ZR1zTOlUcR64cXQLioDnkHIfxIq2HZt
Private-Lines: 1
AAABAQCh3ZR1zTOlUcR64cXQLioDnkHIfxIq2HZtPlJhx2jIclHkCiHp6bR1IqfEouH
Private-MAC: 8f14e45fceea167a5a36dedd4bea2543"""
# A PEM file base64-encoded whole, as kubeconfig and Kubernetes secrets hold one.
PEM_B64 = base64.b64encode(
    b"-----BEGIN RSA " + b"PRIVATE KEY-----\nMIIEowIBAAKCAQEA7bq98Zy9Xw8Vu7Ts6Rq5Po4Nm3Lk2Ji1\n"
    b"-----END RSA PRIVATE KEY-----\n"
).decode()
CERT_B64 = base64.b64encode(
    b"-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUY2EZy9Xw8Vu7Ts6Rq5Po4Nm3Lk2Ji1\n"
    b"-----END CERTIFICATE-----\n"
).decode()


# --- check_body ----------------------------------------------------------------------------


def test_body_is_normalised():
    assert check_body("\r\n\r\nfirst line   \r\n  indented\t\rlast \n\n\n") == (
        "first line\n  indented\nlast"
    )


@pytest.mark.parametrize(
    "body",
    # QA: zero-width characters alone passed as text (U+200B, U+2060, U+FEFF, a bidi mark)
    [
        *("", " ", "\n\n\t\n", "\r\n   \r\n", "\u200b\u200b", "\u2060 \ufeff\n\u200e", "\u3000"),
        # QA, second pass: blank letters and marks with nothing to mark got through
        *("\u3164", "\u115f\u1160", "\u034f", "\u2800 \u2800", "\ufe0f", "\uffa0\u200b"),
    ],
)
def test_empty_body_is_rejected(body):
    with pytest.raises(InvalidRequestError, match="empty") as exc:
        check_body(body)
    assert type(exc.value) is InvalidRequestError
    assert exc.value.details["field"] == "body"


def test_body_at_the_limit_passes_and_one_over_is_too_large():
    assert len(check_body("x" * MAX_BODY_CHARS)) == MAX_BODY_CHARS
    with pytest.raises(TooLargeError) as exc:
        check_body("x" * (MAX_BODY_CHARS + 1))
    assert exc.value.status == 413
    assert "16,000" in exc.value.message


def test_size_is_measured_after_normalisation():
    # Trailing whitespace the writer never meant to store does not count against the limit.
    assert check_body("x" * MAX_BODY_CHARS + "   \n\n  ") == "x" * MAX_BODY_CHARS


def test_control_characters_are_rejected():
    with pytest.raises(InvalidRequestError, match="control characters"):
        check_body("build output \x1b[31mFAILED\x1b[0m")


# The controls Python's strip() and rstrip() take for whitespace, refused inside a value.
SPACE_LIKE_CONTROLS = ["\x1c", "\x1d", "\x1e", "\x1f", "\x0c", "\x0b", "\x85"]


@pytest.mark.parametrize("control", SPACE_LIKE_CONTROLS, ids=lambda c: f"U+{ord(c):04X}")
@pytest.mark.parametrize(
    ("check", "field", "value"),
    [
        (check_body, "body", "Deploys freeze at noon.{}"),
        (check_body, "body", "Deploys freeze{}\nat noon."),
        (check_title, "title", "Deploys{}"),
        (check_source, "source", "docs/deploy.md{}"),
        (lambda tag: check_tags(["ok", tag]), "tags", "deploy{}"),
    ],
    ids=["body", "body-line", "title", "source", "tag"],
)
def test_a_control_at_the_end_is_refused_as_inside_never_trimmed(check, field, value, control):
    """QA: `relay remember "$(printf 'x.\\x1f')"` stored `x.`: 0x1C-0x1F, a form feed, a
    vertical tab and NEL are whitespace to strip(), so at a line's end (a source's, a
    tag's...) they were trimmed unsaid, where inside they were refused. Refused wherever they
    stand, with the code point and its place in the value as sent."""
    at_end = value.format(control)
    for sent in (at_end, value.format(control + "x"), "  " + at_end):
        with pytest.raises(InvalidRequestError, match="control characters") as refused:
            check(sent)
        code_point = f"U+{ord(control):04X}"
        assert refused.value.details == {"field": field, "code_point": code_point}
        assert f"{code_point} at character {sent.index(control)}" in refused.value.message


@pytest.mark.parametrize("control", SPACE_LIKE_CONTROLS, ids=lambda c: f"U+{ord(c):04X}")
@pytest.mark.parametrize(
    ("check", "field", "what"),
    [(check_audiences, "audiences", "audience"), (hygiene.check_roles, "roles", "role")],
)
def test_an_audience_or_role_with_a_control_at_its_end_is_not_a_name(check, field, what, control):
    """As a body's: `ops\\x1f` was `ops`. Refused as a name with one inside is, escaped."""
    for sent in (f"ops{control}", f" Ops{control}", f"o{control}ps"):
        with pytest.raises(
            InvalidRequestError, match=f"^{what} '.*' is not a valid name"
        ) as refused:
            check([sent])
        assert repr(sent.lower()) in refused.value.message  # as sent, what it holds shown
        assert refused.value.details == {"field": field}


def test_whitespace_at_an_end_is_still_trimmed():
    """Spaces, tabs and line breaks (Unicode's too) at an end are trimmed, as before."""
    assert check_body("Freeze at noon. \t\u2028\r\n\nThen ship.\u3000\n") == (
        "Freeze at noon.\n\nThen ship."
    )
    assert check_title("\tDeploys \u2029") == "Deploys"
    assert check_source(" docs/deploy.md\r\n") == "docs/deploy.md"
    assert check_tags(["deploy\n", "\u00a0ops"]) == ("deploy", "ops")
    assert check_audiences(["Ops\t", "\u3000dev "]) == ("dev", "ops")
    assert hygiene.check_roles([" Ops\n"]) == frozenset({"ops"})


@pytest.mark.parametrize(
    ("check", "value", "field"),
    [
        (hygiene.check_body, "probe \ud800 surrogate", "body"),
        (hygiene.check_title, "title \udfff", "title"),
        (hygiene.check_source, "docs/\ud83d.md", "source"),
        (hygiene.check_tags, ["ok", "bad\udc00"], "tags"),
    ],
)
def test_a_lone_surrogate_is_not_text(check, value, field):
    """QA: JSON can spell a lone UTF-16 surrogate; it passed every check and failed to
    encode when the write was hashed (a 500). MCP writes reach these checks directly."""
    with pytest.raises(InvalidRequestError, match="unpaired surrogate") as exc:
        check(value)
    assert exc.value.details["field"] == field


def test_non_string_body_is_rejected():
    with pytest.raises(InvalidRequestError):
        check_body(None)  # type: ignore[arg-type]


def test_secret_in_body_names_the_kinds_not_the_secret():
    body = f"CI uses {GITHUB}\nand the db password = 'Tr0ub4dor&3'"
    with pytest.raises(SecretDetectedError) as exc:
        check_body(body)
    err = exc.value
    assert err.status == 422 and err.code == "secret_detected"
    assert err.message == (
        "memory looks like it contains a secret (github token, password assignment); "
        "remove it or reference where it is stored instead"
    )
    assert err.details["kinds"] == ["github token", "password assignment"]
    assert GITHUB not in str(err.to_dict()) and "Tr0ub4dor" not in str(err.to_dict())


def test_prose_about_secrets_passes():
    body = (
        "Never commit the password to git. Rotate the API key monthly.\n"
        "The deploy token lives in Vault; CI reads it as ${DEPLOY_TOKEN}."
    )
    assert check_body(body) == body


# --- find_secrets: what must be caught ----------------------------------------------------

SECRETS = [
    ("aws access key id", f"aws configure set aws_access_key_id {AWS_ID}"),
    ("aws access key id", "ASIA" + "Y7K3M9Q2X5B8R4T6"),
    ("aws secret access key", f"aws_secret_access_key = {AWS_SECRET}"),
    ("aws secret access key", f'"SecretAccessKey": "{AWS_SECRET}"'),
    ("github token", f"git clone https://{GITHUB}@github.com/acme/app"),
    ("github token", "gh" + "s_" + "Zy9Xw8Vu7Ts6Rq5Po4Nm3Lk2Ji1Hg0FeDcBa"),
    ("github token", "gh" + "o_" + "Zy9Xw8Vu7Ts6Rq5Po4Nm3Lk2Ji1Hg0FeDcBa"),
    ("github token", "gh" + "u_" + "Zy9Xw8Vu7Ts6Rq5Po4Nm3Lk2Ji1Hg0FeDcBa"),
    ("github token", "github_" + "pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyzABCD"),
    ("gitlab token", "gl" + "pat-" + "xY3zA9bC7dE1fG5hJ2kL"),
    ("slack token", "xo" + "xb-" + "123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx"),
    ("slack token", "xo" + "xp-" + "123456789012-1234567890123-9f8e7d6c5b4a"),
    ("slack webhook", "https://hooks.slack.com/services/" + "T0A1B2C3D/B0A1B2C3D/Ab12Cd34Ef56Gh78"),
    ("stripe key", "sk" + "_live_" + "51HqXy2eZvKYlo2C8Nq3Rt5W"),
    ("stripe key", "rk" + "_live_" + "51HqXy2eZvKYlo2C8Nq3Rt5W"),
    ("openai api key", "OPENAI_API_KEY=sk-" + "proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z"),
    ("openai api key", "sk-" + "Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4zAb3dEf6hIj9kLm2n"),
    ("anthropic api key", "sk-" + "ant-api03-Zk3xP9qLm2Vn7Rt4Wy8Bc1Df6Gh0Jk5"),
    ("google api key", "AI" + "zaSyD3f8Kq2Lm9Np4Rt7Vw1Xz6Bc0Df5Gh8Jk"),
    ("jwt", f"Example session cookie: {JWT}"),
    ("private key", "-----BEGIN RSA PRIVATE KEY-----\nMIIEow...\n-----END RSA PRIVATE KEY-----"),
    ("private key", "-----BEGIN OPENSSH PRIVATE KEY-----"),
    ("private key", "-----BEGIN PRIVATE KEY-----"),
    ("private key", "-----BEGIN PGP PRIVATE KEY BLOCK-----"),
    ("private key", "----BEGIN RSA PRIVATE KEY----\nMIIEow...\n----END RSA PRIVATE KEY----"),
    ("private key", "--- BEGIN EC PRIVATE KEY ---"),
    ("private key", PUTTY),
    ("private key", PUTTY[PUTTY.index("Private-Lines") :]),
    ("google oauth client secret", "OAuth client GOC" + "SPX-v5ZJr3J1TWDtkwtDDb_xHKas1VOq"),
    (
        "google oauth token",
        "gcloud auth print-access-token gave ya" + "29.a0AfH6SMBx3kZ9qLm2Vn7Rt4Wy8Bc1Df6",
    ),
    (
        "sendgrid api key",
        "mail relay uses S"
        + "G.g6YYZYn9ZhyiA4uoRgnatm.UdjAWtGSU8po_799NksnRH9ucAUsdMlHUvTCQCyEZDz",
    ),
    ("shopify token", "the Shopify app token is shp" + "at_fb008f86bebb2737f6a6f0fb23c6f5da"),
    (
        "digitalocean token",
        "doctl auth init -t do"
        + "p_v1_2cec255404e4fb440034d6608697a8d41bed440e50454f31af3176813e02ea68",
    ),
    ("twilio api key", "twilio api key sid S" + "Kef786e4d3cea27d26934b484e73cf575"),
    (
        "azure storage key",
        "DefaultEndpointsProtocol=https;AccountName=acmeprod;AccountKey="
        + AZURE_KEY
        + ";EndpointSuffix=core.windows.net",
    ),
    (
        "azure storage key",
        "Endpoint=sb://acme.servicebus.windows.net/;SharedAccessKeyName=RootManageSharedAccessKey;"
        "SharedAccessKey=J6Cus/7pIy+K8iEfnuSRxbEL7LVWO/web5NCfsvI/ik=",
    ),
    (
        "azure sas token",
        "https://acme.blob.core.windows.net/backups/db.gz?sv=2022-11-02&ss=b&srt=o&sp=r"
        "&se=2026-01-01T00:00:00Z&sig=a%2Bb3C4d5E6f7G8h9I0j1K2l3M4n5O6p7Q8r9S0t%3D",
    ),
    ("password in url", "DATABASE_URL=postgres://app:" + "s3cr3tPw@db.internal:5432/app"),
    ("password in url", "redis://:" + "9fKq2LmX@cache:6379/0"),
    ("authorization header", 'curl -H "Authorization: Bearer ' + 'abcDEF123456ghiJKL789mno"'),
    ("relay api key", "relay_" + "k7f3a9_Zx8Qw2Lm5Np7Rt1Vy4Bc6Df9"),
    ("npm token", "//registry.npmjs.org/:_authToken=npm_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"),
    ("hugging face token", "hf_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7"),
    ("password in command", "curl -u admin:" + "Tr0ub4dor3xK9 https://jenkins.internal/job/deploy"),
    ("password in command", 'curl -sS --user "deploy:' + 'Tr0ub4dor3xK9" https://nexus.internal'),
    ("password in command", "curl -X POST -su admin:" + "Tr0ub4dor3xK9 https://x.internal"),
    ("password in command", "mysql -u root -p" + "S3cretPass db"),
    ("password in command", 'mysqldump -uroot -p"' + 'S3cret#" app > dump.sql'),
    ("password in command", "sshpass -p " + "'S3cret!x' ssh deploy@bastion"),
    ("password assignment", 'password = "hunter22"'),
    ("password assignment", "export DB_PASS=" + "Tr0ub4dor3xK9"),
    ("password assignment", "MYSQL_PASS: 'S3cret!'"),
    ("password assignment", 'const dbPass = "hunter22";'),
    ("password assignment", "openssl enc -aes-256-cbc -pass pass:" + "S3cret99 -in a -out b"),
    ("password assignment", 'passphrase: "correct horse battery staple"'),
    ("password assignment", '"password": "correct horse battery staple"'),
    ("password assignment", "gpg --passphrase 'Tr0ub4dor3xK9' --batch -d backup.gpg"),
    ("password in command", "mysql -h db -u root -p'" + "S3cret Pass!' app"),
    ("secret assignment", "export STRIPE_KEY=" + "rk9Xs2LpQ7hTz4vWm1NcR8yB3eJdF6uA"),
    ("secret assignment", "APP_KEY=base64:" + "Zm9vYmFyYmF6cXV4cXV1eDEyMzQ1Njc4OTA="),
    ("secret assignment", "MAILGUN_KEY=key-" + "3ax6xnjp29jd6fds4gc373sgvjxteol0"),
    ("password assignment", "DB_PASSWORD=Xq8mV2pL"),
    ("password assignment", "  password: Tr0ub4dor&3"),
    ("password assignment", '{"password": "Sup3rS3cret!"}'),
    ("password assignment", "password: str = 'Tr0ub4dor&3'"),
    ("password assignment", 'db_password := "p4ssw0rd!"'),
    ("password assignment", ":password => 'h0rse-battery'"),
    ("password assignment", "mysql --password hunter22 -u root"),
    ("password assignment", "Password: Test@123"),
    ("secret assignment", "client_secret: 'a8f5f167f44f4964e6c998dee827110c'"),
    ("secret assignment", "SECRET_KEY = 'django-insecure-8x#k2@p!m'"),
    ("secret assignment", "clientSecret: 'Zm9vYmFyYmF6cXV4cXV1eA'"),
    ("api key assignment", "api_key=9c4f2b7e1a3d"),
    ("api key assignment", "apiKey: '4f9a1c2e7b3d5a8f'"),
    ("api key assignment", "x-api-key: 4f9a1c2e7b3d5a8f"),
    ("token assignment", "token=abc123def456"),
    ("token assignment", "export GITLAB_TOKEN='tok3n-value'"),
    ("token assignment", "https://api.example.com/v1?access_token=8f14e45fceea167a"),
    # QA: real formats the scan let through (shapes from each vendor's docs, random bodies).
    ("docker hub token", "docker login -u acmeci -p dck" + "r_pat_0xw7rNFE50wa_9bf2uZD_wPxg7a"),
    ("docker hub token", "dck" + "r_oat_Kq7Xp2LmV9nR4tW8yB3cD6fG1hJ5"),
    ("gitlab token", "deploy token gl" + "dt-eKO7evVLwMD760_a677v"),
    ("gitlab token", "runner token gl" + "rt-t3_Zy9Xw8Vu7Ts6Rq5Po4Nm"),
    ("gitlab token", "trigger gl" + "ptt-9f8e7d6c5b4a39281706f5e4d3c2b1a0"),
    ("gitlab token", "--registration-token GR1348" + "941Zy9Xw8Vu7Ts6Rq5Po4Nm"),
    (
        "slack token",
        "SLACK_APP_TOKEN for Socket Mode: xa"
        + "pp-1-A0VV95LD8E5-9996672042860-f7aae716c2d6fe45813f80d54332e2b2",
    ),
    (
        "slack webhook",
        "https://hooks.slack.com/workflows/"
        + "T3PI8HTGV/AZQSO7YITEL/085774078552038382/y0h4N546I2vCFzpBcJtymXTA",
    ),
    (
        "slack webhook",
        "https://hooks.slack.com/triggers/"
        + "T3PI8HTGV/6158012345678/9f8e7d6c5b4a39281706f5e4d3c2b1a0",
    ),
    ("stripe key", "STRIPE_WEBHOOK_SECRET is wh" + "sec_vgJ3n6kwbDfKHSEfLvbghbUAvWOYJRE5"),
    ("secret assignment", "SECRET_KEY_BASE=" + "3288f4e6cb097188f44b7ec25c5b44ed3d3bd6fa0aa43c59"),
    ("secret assignment", "production:\n  secret_key_base: " + "3b7cd727ee24e8444053437c36cc66c3"),
    ("private key", f"users:\n- name: admin\n  user:\n    client-key-data: {PEM_B64}"),
    ("private key", f"kind: Secret\ntype: kubernetes.io/tls\ndata:\n  tls.key: {PEM_B64}"),
]


@pytest.mark.parametrize(("kind", "text"), SECRETS)
def test_secret_is_found(kind, text):
    assert find_secrets(text) == [kind]
    with pytest.raises(SecretDetectedError, match=kind):
        check_body(text)


def _minted_relay_keys(n: int) -> list[str]:
    """Keys shaped like relay.auth.mint_key's: token_hex(6) id, token_urlsafe(24) secret."""
    rng = random.Random(20261129)
    urlsafe = string.ascii_letters + string.digits + "-_"
    return [
        "relay_"
        + "".join(rng.choice("0123456789abcdef") for _ in range(12))
        + "_"
        + "".join(rng.choice(urlsafe) for _ in range(32))
        for _ in range(n)
    ]


def test_every_minted_relay_key_is_found():
    keys = _minted_relay_keys(500)
    assert any("_" in k[19:] for k in keys)  # secrets with underscores of their own included
    for key in keys:
        assert find_secrets(f"curl -H 'X-Key: {key}'") == ["relay api key"], key


def test_kinds_come_in_order_of_appearance_once_each():
    text = f"first {JWT} then {GITHUB} then {JWT} and password = 'hunter22'"
    assert find_secrets(text) == ["jwt", "github token", "password assignment"]


def test_a_specific_kind_is_not_also_reported_as_an_assignment():
    assert find_secrets(f"GITHUB_TOKEN={GITHUB}") == ["github token"]
    assert find_secrets(f"Authorization: Bearer {JWT}") == ["jwt"]


@pytest.mark.parametrize(
    ("kind", "text"),
    [
        ("github token", GITHUB[:10] + "\u200b" + GITHUB[10:]),  # zero-width space
        ("github token", GITHUB[:4] + "\u200d" + GITHUB[4:20] + "\u2060" + GITHUB[20:]),
        ("github token", "".join(chr(ord(c) + 0xFEE0) for c in GITHUB)),  # full-width
        ("aws access key id", AWS_ID[:8] + "\u00ad" + AWS_ID[8:]),  # soft hyphen
        ("aws access key id", "\ufeff" + AWS_ID[:6] + "\u200c" + AWS_ID[6:]),
        ("password assignment", "ｐａｓｓｗｏｒｄ＝Ｔｒ０ｕｂ４ｄｏｒ３"),
    ],
)
def test_invisible_and_full_width_characters_do_not_hide_a_secret(kind, text):
    """QA: a ghp_ token with U+200B inside, or written in full-width letters, was stored:
    it reads the same to a person and to a model, so it is matched as it reads."""
    assert find_secrets(text) == [kind]


# --- find_secrets: what must pass ---------------------------------------------------------

NOT_SECRETS = [
    f"client-certificate-data: {CERT_B64}",  # a certificate, encoded the same way, is public
    '  secret_key_base: <%= ENV["SECRET_KEY_BASE"] %>',
    "config.secret_key_base = Rails.application.credentials.secret_key_base",
    # prose about secrets
    "Never commit the password to git.",
    "Rotate the API key monthly.",
    "The API key: stored in 1Password under 'Stripe prod'.",
    "Password: see the vault",
    "Secrets: never in the repo, always in Vault.",
    "Access token: expires after one hour, refresh token after 30 days.",
    "Use a strong password: at least 12 characters.",
    "Store passwords using strong, salted hashes (e.g., Argon2, bcrypt).",
    "Use `--token` for one-off scripts where env var injection is not possible",
    "Include the token in headers (Authorization: Bearer {token}) and authToken: {token}.",
    "The JWT secret is read from the request body, see src/auth.ts:42",
    # references to where a secret lives
    "DB_PASSWORD=${DB_PASSWORD}",
    "password = os.environ['DB_PASSWORD']",
    "api_key = os.getenv('OPENAI_API_KEY')",
    "token=$GITHUB_TOKEN",
    "export OPENAI_API_KEY=$(op read op://vault/openai/key)",
    "token: ${{ secrets.GITHUB_TOKEN }}",
    "password: process.env.DB_PASSWORD",
    "SECRET_KEY = env('DJANGO_SECRET_KEY')",
    "postgres://user:${PGPASSWORD}@localhost/db",
    "secret: op://Engineering/stripe/api-key",
    'curl -H "Authorization: Bearer $RELAY_KEY" https://relay.internal/v1/search',
    # placeholders
    "api_key: <your-api-key>",
    'password: "***"',
    "password: ********",
    "password: changeme",
    'token = "YOUR_TOKEN_HERE"',
    "api_key=xxxxxxxxxxxxxxxx",
    "postgres://user:password@localhost/db",
    'OPENAI_API_KEY="sk-..."',
    "AK" + "IAIOSFODNN7EXAMPLE",
    "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "relay_<key id>_<secret>",
    # code that names secrets without holding one
    "api_key: str",
    "password: string;",
    "token: Optional[str] = None",
    "password: z.string().min(8)",
    "token: req.headers.authorization",
    "max_tokens: 1000",
    "tokens: 4096",
    "token_count = 12",
    "password_min_length: 12",
    "secret_name: prod/db",
    "password_file: /run/secrets/db_password",
    "secret: /run/secrets/db",
    "token_url: https://auth.example.com/oauth/token",
    "if (password.length < 8) return error",
    # look-alikes that are not credentials
    "sk-learn is not a package name; use scikit-learn",
    "relay_import_files_from_directory_tree",
    "git@github.com:acme/app.git",
    "https://example.com:8080/path",
    "ssh://git@github.com/acme/app",
    "Use design tokens from tailwind.config.js",
    "eyJ is how base64 of a JSON object starts",
    "Explicit BEGIN/COMMIT for multi-statement changes",
    "commit 3eb6f2c0a1d4b5e6f7a8b9c0d1e2f3a4b5c6d7e8",
    "sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    # commands that take the password from elsewhere, or name its slot
    "use `curl -u $USER:$TOKEN` against the Jenkins API",
    'curl -u "${API_USER}:${API_TOKEN}" https://api.internal',
    "curl --user elastic:$ELASTIC_PASSWORD http://localhost:9200",
    "curl -u api:YOUR_API_KEY https://api.mailgun.net/v3/domains",
    "curl -u <user>:<password> https://nexus.internal",
    "curl -u admin:changeme http://localhost:9200",
    "curl -u token:x-oauth-basic https://api.github.com/user",
    'curl -u "$(cat ~/.jenkins-user):$(cat ~/.jenkins-token)" https://jenkins.internal',
    "mysql -u root -p app_db",
    "mysql -uroot -p$MYSQL_ROOT_PASSWORD",
    "mysql -h db -P3306 -u app -p<password>",
    "Run mysql with -p to be prompted; never put the password on the command line.",
    'sshpass -p "$SSHPASS" ssh deploy@bastion',
    "docker run -u 1000:1000 node:20 npm test",
    "git push -u origin feature/x:feature/x",
    "curl -fsSL https://get.docker.com -o get-docker.sh",
    # env variables named, referenced or stood in for
    "set DB_PASS from the secret manager",
    "DB_PASS=${DB_PASS}",
    "DB_PASS=<password>",
    "export DB_PASS=$(vault kv get -field=pass secret/db)",
    'export DB_PASS="$(op read op://prod/db/password)"',
    "DB_PASS=changeme",
    "DB_PASS=xxxx",
    "bypass=true",
    "compass: N45E12W",
    "Pass: 12/12 tests",
    "CACHE_KEY=user_profile_v2_by_org_id_12",
    "SORT_KEY=created_at",
    "IDEMPOTENCY_KEY=3f2a9c4e-1b2d-4e5f-8a9b-0c1d2e3f4a5b",
    "SSH_KEY=~/.ssh/id_ed25519",
    "GPG_KEY=3AA5C34371567BD2",
    "S3_KEY=uploads/2024/reports/q1-summary",
    "REDIS_KEY=session:abc123def456ghi789",
    "AWS_S3_OBJECT_KEY=backups/2024-06-01/db.sql.gz",
    "STRIPE_PUBLISHABLE_KEY=pk_test_51HqXy2eZvKYlo2C8Nq3Rt5W",
    "NEXT_PUBLIC_MAPBOX_KEY=pk9Xs2LpQ7hTz4vWm1NcR8yB3eJdF6uA",
    "LICENSE_KEY=${LICENSE_KEY}",
    "OPENAI_KEY=sk-...",
    # QA: a value cut short by an ellipsis, as docs and READMEs show a key's start
    "ANTHROPIC_API_KEY=sk-ant-api03-...",
    "export OPENAI_API_KEY=sk-proj-abc123...",
    "GITHUB_TOKEN=ghp_1234…",
    "(STRIPE_SECRET_KEY=sk_live_51H...).",
    "the deploy key lives in the vault",
    # quoted words that are a hint, a label or a sentence, not a passphrase
    'password: "see the vault"',
    'password: "stored in 1Password"',
    '"password": "Mot de passe"',
    '"password": "Passwort erneut eingeben"',
    'password: "Database password for the app user"',
    'passphrase: "Used to unlock the backup"',
    'password: "Required field"',
    'password: "Min 8 chars"',
    '"password": "Forgot your password?"',
    '"passphrase": "Enter a passphrase"',
    'passphrase: "your passphrase here"',
    'password: "<correct horse battery staple>"',
    'passphrase: "${BACKUP_PASSPHRASE}"',
    'label: "correct horse battery staple"',
    'Use a passphrase like "correct horse battery staple".',
    'pwd: "print working directory"',
    '"passwordConfirm": "Passwords do not match"',
    # provider formats named, not given
    "Google OAuth client secrets start with GOCSPX-; keep them in the secret manager.",
    "A token starting ya29. is a Google access token: it expires within the hour.",
    "SendGrid keys look like SG.xxxxxxxxxxxxxxxxxxxxxx.yyyy; store them as SENDGRID_API_KEY.",
    "Shopify admin tokens start with shpat_ and are shown once.",
    "DigitalOcean tokens (dop_v1_...) live in 1Password under 'DO prod'.",
    "Order SK" + "E3B0C44298FC1C149AFBF4C8996FB924 shipped.",  # upper-case hex: a SKU, a hash
    "AccountKey=<storage-account-key>;EndpointSuffix=core.windows.net",
    "DefaultEndpointsProtocol=https;AccountName=acmeprod;AccountKey=${AZURE_STORAGE_KEY}",
    "Locally: DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey="
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;"
    "BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;",  # Azurite's published key
    "UseDevelopmentStorage=true",
    "A SAS URL carries sv=2022-11-02 and a sig= parameter: never paste one here.",
    "-----BEGIN PUBLIC KEY-----",
    "-----BEGIN CERTIFICATE-----",
    "--- BEGIN release notes ---",
    "PuTTY-User-Key-File-3 is the .ppk header; convert with puttygen key.ppk -O private-openssh",
    "Private-Lines: says how many base64 lines of the private blob follow.",
    # text outside ASCII, read as it is written
    "The on-call family 👨\u200d👩\u200d👧 rotates the deploy token every Friday.",
    "パスワード：金庫に保管（ｖａｕｌｔ）",
    "ｐａｓｓｗｏｒｄ： ｃｈａｎｇｅｍｅ",
    "Use\u00a0the\u200bsecret manager; token\u2060=\u2060${DEPLOY_TOKEN}",
    "كلمة المرور في الخزنة\u200f (password: see the vault)",
]


@pytest.mark.parametrize("text", NOT_SECRETS)
def test_not_a_secret(text):
    assert find_secrets(text) == []


@pytest.mark.parametrize(
    "text",
    [
        "a" * MAX_BODY_CHARS,
        "password=" * (MAX_BODY_CHARS // 9),
        "a:" * (MAX_BODY_CHARS // 2),
        "http://" * (MAX_BODY_CHARS // 7),
        ("a" * 60 + "=") * (MAX_BODY_CHARS // 61),
        "eyJ" * (MAX_BODY_CHARS // 3),
        "PuTTY-User-Key-File-3: x\n" * (MAX_BODY_CHARS // 25),
        "sv=2022-01-01&" * (MAX_BODY_CHARS // 14),
        "---BEGIN" + " " * MAX_BODY_CHARS,
        "curl -u " * (MAX_BODY_CHARS // 8),
    ],
    ids=[
        "letters",
        "assignments",
        "colons",
        "schemes",
        "long-keys",
        "jwt-prefixes",
        "ppk-headers",
        "sas-versions",
        "pem-begin",
        "curl-flags",
    ],
)
def test_scanning_a_full_size_body_is_fast(text):
    start = time.perf_counter()
    find_secrets(text)
    # A linear scan takes 10 to 70 ms here; backtracking over a 64 K body would take minutes.
    # The bound sits far from both, so a loaded CI machine (0.5 s failed at load 10) passes.
    assert time.perf_counter() - start < 5


# --- the benchmark corpora: real rule texts ------------------------------------------------

# Literal test-account passwords in QA test-case templates: genuine password assignments.
EXPECTED_BENCH_HITS = {
    "testrail-test-case-cursorrules-prompt-file:48",  # Password: Test@123
    "testrail-test-case-cursorrules-prompt-file:59",  # Password: WrongPassword123
    "xray-test-case-cursorrules-prompt-file:10",  # Password: Password123
    "xray-test-case-cursorrules-prompt-file:36",  # Password: Password123
}


@pytest.mark.parametrize(
    ("folder", "count", "expected"),
    [("cursorrules_bullets", 6725, EXPECTED_BENCH_HITS), ("coding_prompts", 675, set())],
)
def test_no_false_positives_on_real_rule_texts(folder, count, expected):
    path = BENCH / folder / "memories.jsonl"
    if not path.exists():
        pytest.skip(f"benchmark data not present at {path}")
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert len(records) == count
    hits = {r["id"]: find_secrets(r["text"]) for r in records if find_secrets(r["text"])}
    assert set(hits) == expected
    assert all(kinds == ["password assignment"] for kinds in hits.values())


# --- title, source, tags -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("title", "expected"),
    [
        (None, None),
        ("", None),
        ("   ", None),
        ("  Testing ›  Fixtures ", "Testing › Fixtures"),
        ("two\tspaced  words", "two spaced words"),
        ("\r\nOne line\u2029", "One line"),
        ("\u200b\u200b", None),
        ("\u200bkept", "\u200bkept"),
    ],
)
def test_title_is_normalised(title, expected):
    assert check_title(title) == expected


@pytest.mark.parametrize(
    "line_break", ["\n", "\r", "\r\n", "\u2028", "\u2029"], ids=["LF", "CR", "CRLF", "LS", "PS"]
)
def test_a_line_break_inside_a_title_is_refused_whichever_it_is(line_break):
    """QA: `relay remember x --title "$(printf 'a\\r\\nb')"` was refused for its U+000D
    while `a\\nb` was stored as `a b`, a newline made a space unsaid. A title is one line
    (an import's heading, the console's field): every line break inside it is refused the
    same, naming the first code point and its place in the title as sent."""
    sent = f"  Deploy{line_break}checklist"
    code_point = f"U+{ord(line_break[0]):04X}"
    said = re.escape(code_point)
    with pytest.raises(
        InvalidRequestError,
        match=rf"^title must be one line, without a line break \({said} at character 8\)$",
    ) as refused:
        check_title(sent)
    assert refused.value.details == {"field": "title", "code_point": code_point}
    assert check_title(f"{line_break}Deploy checklist{line_break}") == "Deploy checklist"


def test_a_secret_spread_over_lines_in_a_title_is_refused_as_a_secret():
    """The secret is what matters: refused as one, not as a title of several lines."""
    key = "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA7bq98\n-----END RSA PRIVATE KEY-----"
    with pytest.raises(SecretDetectedError, match="^title looks like"):
        check_title(key)


def test_title_limits():
    assert check_title("t" * hygiene.MAX_TITLE_CHARS)
    with pytest.raises(TooLargeError):
        check_title("t" * (hygiene.MAX_TITLE_CHARS + 1))
    with pytest.raises(InvalidRequestError, match="control"):
        check_title("bell\x07")
    with pytest.raises(SecretDetectedError, match="title looks like"):
        check_title(f"token {GITHUB}")


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (None, None),
        ("  ", None),
        ("workspace/memories/migrations", "workspace/memories/migrations"),
        (" .cursor/rules/react.mdc ", ".cursor/rules/react.mdc"),
        ("docs/My Notes.md", "docs/My Notes.md"),
        (
            "https://github.com/acme/app/blob/main/AGENTS.md",
            "https://github.com/acme/app/blob/main/AGENTS.md",
        ),
    ],
)
def test_source_is_accepted(source, expected):
    assert check_source(source) == expected


def test_source_limits():
    assert check_source("s" * 300) == "s" * 300
    with pytest.raises(TooLargeError):
        check_source("s" * 301)
    for bad in ("a\nb", "a\tb", "a\x00b"):
        with pytest.raises(InvalidRequestError, match="one line"):
            check_source(bad)
    with pytest.raises(SecretDetectedError, match="password in url"):
        check_source("https://bob:" + "Xq8mV2pL@git.internal/acme/app")


def test_tags_are_stripped_and_deduplicated_keeping_case():
    assert check_tags([" db ", "glob:src/**/*.TS", "db", "always-apply"]) == (
        "db",
        "glob:src/**/*.TS",
        "always-apply",
    )
    assert check_tags(None) == ()
    assert check_tags([]) == ()
    assert check_tags("single") == ("single",)


@pytest.mark.parametrize(
    ("tags", "error"),
    [
        ([""], InvalidRequestError),
        (["two words"], InvalidRequestError),
        (["x" * 101], TooLargeError),
        ([f"t{i}" for i in range(33)], TooLargeError),
        ([1], InvalidRequestError),
        ([GITHUB], SecretDetectedError),
    ],
    ids=["empty", "whitespace", "long", "many", "not-str", "secret"],
)
def test_bad_tags_are_rejected(tags, error):
    with pytest.raises(error):
        check_tags(tags)


def test_a_secret_in_a_tag_is_refused_before_any_message_repeats_it():
    for tags in ([f"ci {GITHUB}"], [f"{GITHUB}-" + "x" * 100]):  # whitespace, too long
        with pytest.raises(SecretDetectedError) as exc:
            check_tags(["ok", *tags])
        assert GITHUB not in exc.value.message


# --- ids and key names ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("memory_id", "kind"),
    [
        (AWS_ID, "aws access key id"),
        (GITHUB, "github token"),
        ("sk" + "_live_" + "51Hx9QkL2mN8pR4tV6wY0zB", "stripe key"),
        ("password:" + "Hunter2xQ9", "password assignment"),
    ],
)
def test_a_secret_shaped_id_is_refused_naming_the_field(memory_id, kind):
    """QA: ids appear in search results, the hook's context and exports, yet an AWS key
    id, a GitHub token or a Stripe key was accepted as one (201)."""
    with pytest.raises(SecretDetectedError, match=f"^id looks like .*{kind}") as exc:
        hygiene.check_given_id(memory_id)
    assert exc.value.details["field"] == "id"
    assert memory_id not in exc.value.message


@pytest.mark.parametrize(
    "memory_id",
    [
        "mem_3f9a1c2e7b3d5a8f",
        "imp_0123456789abcdef.2",
        "S1:Caroline:0",
        "deploy-token-rotation",
        "password-policy",
        "secret:rotation",
        "ghp_docs",
        "AKIA-format-notes",
    ],
)
def test_ordinary_ids_pass(memory_id):
    assert hygiene.check_given_id(memory_id) == memory_id


def test_a_secret_shaped_key_name_is_refused():
    """QA: POST /v1/keys {"name": "ci password=Hunter2xQ9!"} made the key (201); a key's
    name is listed by `relay key list`, the console and whoami."""
    with pytest.raises(SecretDetectedError, match="^name looks like") as exc:
        hygiene.check_key_name("ci password=" + "Hunter2xQ9!")
    assert exc.value.details["field"] == "name"
    for name in ("ci", "alice laptop", "deploy token for CI", "password rotation bot"):
        hygiene.check_key_name(name)


def test_a_secret_shaped_role_or_audience_is_refused():
    """A role is listed with its key and, as an audience, beside every memory addressed to
    it; lower-case as it must be, a GitHub or Stripe token still fits its rule."""
    token = GITHUB.lower()
    with pytest.raises(SecretDetectedError, match="^roles looks like .*github token") as exc:
        hygiene.check_roles(["platform", token])
    assert exc.value.details["field"] == "roles"
    with pytest.raises(SecretDetectedError, match="^audiences looks like") as exc:
        check_audiences(["backend", "sk" + "_live_51hqxy2ezvkylo2c8nq3rt5w"], None)
    assert exc.value.details["field"] == "audiences"
    for unfit in (AWS_ID, "password=" + "Hunter2xQ9"):  # judged before a message repeats it
        for check in (hygiene.check_roles, lambda names: check_audiences(names, {"ops"})):
            with pytest.raises(SecretDetectedError) as exc:
                check(["ops", unfit])
            assert unfit not in exc.value.message
    assert hygiene.check_roles(["ghp-team", "secrets.admins", "token-rotation"]) == frozenset(
        {"ghp-team", "secrets.admins", "token-rotation"}
    )


# --- audiences ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("audiences", "expected"),
    [
        (["backend"], ("backend",)),
        (["ops", "backend", "ops"], ("backend", "ops")),
        ([" Backend "], ("backend",)),
        ("backend", ("backend",)),
        (["all"], ("all",)),
        (["backend", "all"], ("all",)),
        (["team.platform-2_x"], ("team.platform-2_x",)),
        (["a" * 64], ("a" * 64,)),
    ],
)
def test_audiences_are_normalised(audiences, expected):
    assert check_audiences(audiences, None) == expected


@pytest.mark.parametrize(
    "audiences",
    [None, [], ["-ops"], ["_ops"], ["back end"], ["ops!"], ["a" * 65], [""], [3]],
)
def test_bad_audiences_are_rejected(audiences):
    with pytest.raises(InvalidRequestError) as exc:
        check_audiences(audiences, None)
    assert exc.value.details["field"] == "audiences"


def test_unknown_audiences_are_rejected_only_when_the_org_list_is_given():
    allowed = {"backend", "ops"}
    assert check_audiences(["backend"], allowed) == ("backend",)
    assert check_audiences(["all"], allowed) == ("all",)
    assert check_audiences(["all"], set()) == ("all",)
    with pytest.raises(InvalidRequestError, match="unknown audiences: frontend, qa") as exc:
        check_audiences(["backend", "qa", "frontend"], allowed)
    assert exc.value.details["unknown"] == ["frontend", "qa"]
    # QA: the hint left out --org and --name, so it failed as written
    hint = "relay key create --org ORG --name NAME --scope memory:read --role frontend"
    assert hint in exc.value.message
    assert check_audiences(["frontend"], None) == ("frontend",)


def test_too_many_audiences():
    with pytest.raises(TooLargeError):
        check_audiences([f"r{i}" for i in range(33)], None)


# --- valid_until ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", None),
        ("2026-12-31", datetime(2026, 12, 31, tzinfo=UTC)),
        ("2026-12-31T18:00:00Z", datetime(2026, 12, 31, 18, tzinfo=UTC)),
        ("2026-12-31T18:00:00+02:00", datetime(2026, 12, 31, 16, tzinfo=UTC)),
        ("2026-12-31T18:00:00", datetime(2026, 12, 31, 18, tzinfo=UTC)),
        ("2026-06-01 12:00:01", datetime(2026, 6, 1, 12, 0, 1, tzinfo=UTC)),
        (datetime(2027, 1, 1), datetime(2027, 1, 1, tzinfo=UTC)),
        (
            datetime(2027, 1, 1, 9, tzinfo=timezone(timedelta(hours=9))),
            datetime(2027, 1, 1, 0, tzinfo=UTC),
        ),
    ],
)
def test_valid_until_is_parsed_to_utc(value, expected):
    result = check_valid_until(value, NOW)
    assert result == expected
    if result is not None:
        assert result.tzinfo is UTC


@pytest.mark.parametrize(
    "value",
    ["2026-06-01T12:00:00Z", "2026-06-01T13:59:59+02:00", "2020-01-01", NOW - timedelta(seconds=1)],
)
def test_valid_until_not_in_the_future_is_rejected(value):
    with pytest.raises(InvalidRequestError, match="not in the future"):
        check_valid_until(value, NOW)


@pytest.mark.parametrize("value", ["next tuesday", "2026-13-01", "31/12/2026", 1767225600])
def test_valid_until_garbage_is_rejected(value):
    with pytest.raises(InvalidRequestError, match="valid_until"):
        check_valid_until(value, NOW)


def test_valid_until_defaults_to_the_real_clock_and_accepts_naive_now():
    assert check_valid_until("2999-01-01") == datetime(2999, 1, 1, tzinfo=UTC)
    with pytest.raises(InvalidRequestError):
        check_valid_until("2000-01-01")
    naive_now = NOW.replace(tzinfo=None)
    assert check_valid_until("2026-06-02", naive_now) == datetime(2026, 6, 2, tzinfo=UTC)


def test_roles_are_normalised_and_checked_like_audiences():
    assert hygiene.check_roles([" Platform", "platform", "SRE.oncall"]) == frozenset(
        {"platform", "sre.oncall"}
    )
    assert hygiene.check_roles(None) == frozenset()
    for bad in ("", "Ops Team", "x" * 65, "a\x00b", "all", "dév"):
        with pytest.raises(InvalidRequestError) as exc:
            hygiene.check_roles([bad])
        assert exc.value.details == {"field": "roles"}
    with pytest.raises(TooLargeError):
        hygiene.check_roles([f"r{i}" for i in range(hygiene.MAX_ROLES + 1)])


@pytest.mark.parametrize(
    "late", ["9999-12-31T23:59:59.9999999Z", "9999-12-31T23:59:59.000001Z", "9999-12-31T23:59:59.5"]
)
def test_no_time_past_the_last_whole_second_of_9999_is_taken(late):
    """QA: "9999-12-31T23:59:59.9999999Z" was taken, and SQLite stored it as a float that
    rounds to year 10000, which no read of the row could turn back into a time."""
    with pytest.raises(ValueError, match=r"^is past 9999-12-31T23:59:59Z, the latest that can"):
        hygiene.parse_time(late)
    latest = hygiene.parse_time("9999-12-31T23:59:59Z")
    assert latest == hygiene.LATEST_TIME
    assert datetime.fromtimestamp(latest.timestamp(), UTC) == latest  # as SQLite reads it
    assert hygiene.parse_time("9999-12-31") == datetime(9999, 12, 31, tzinfo=UTC)


@pytest.mark.parametrize("blank", ["\u200b\u200b", "\u3164", "\u2060\u034f"])
def test_an_invisible_source_is_none_and_an_invisible_tag_is_refused(blank):
    assert check_source(blank) is None
    with pytest.raises(InvalidRequestError, match="empty or invisible"):
        check_tags([blank])


def test_text_with_something_to_see_is_not_blank():
    for text in ("e\u0301", "\u200bx", "\U0001f44d\ufe0f", "\u3164a"):
        assert check_body(text)


def test_one_walker_finds_a_lone_surrogate_in_nested_json_keys_included():
    """The API's request models and `relay mcp`'s stdio transport each walked JSON for a
    lone surrogate their own way; one walker serves both, without recursion (json.loads
    nests deeper than a recursive walk could go)."""
    import json

    from relay.hygiene import surrogate_in

    assert surrogate_in({"a": ["ok", {"b": "x\ud800"}]}) == ("a[1].b", "x\ud800")
    assert surrogate_in({"k\udc00": 1}) == ("a key in the value", "k\udc00")
    assert surrogate_in({"p": {"k\udc00": 1}}, "the message") == ("a key in p", "k\udc00")
    assert surrogate_in("\ud800") == ("", "\ud800")
    paired = json.loads('{"a": "\U0001f600", "b": [1, null, "pair \\ud83d\\ude00"]}')
    assert surrogate_in(paired) is None  # JSON's escaped pair is one character
    deep: object = "\ud800"
    for _ in range(100_000):
        deep = [deep]
    assert surrogate_in(deep) == ("[0]" * 100_000, "\ud800")


def test_one_json_number_check_for_every_reader():
    """NaN, Infinity and 1e400 (read as infinity) are no JSON: one pair of json.loads hooks,
    in the hook's own stdlib-only codec, refuses them for the settings files, the outcome
    logs and relay mcp alike."""
    import json

    from relay.hook.codec import NotJSONNumber, finite, loads, no_constant

    for text, infinite in (("[1e400]", True), ("[-1E+999]", True), ("[NaN]", False)):
        with pytest.raises(NotJSONNumber) as exc:
            json.loads(text, parse_float=finite, parse_constant=no_constant)
        assert exc.value.args[1] is infinite
    assert json.loads("[1.5, 2]", parse_float=finite, parse_constant=no_constant) == [1.5, 2]
    with pytest.raises(ValueError, match="-Infinity is no JSON number"):
        loads('{"a": -Infinity}')


@pytest.mark.parametrize(
    ("text", "code_point"),
    [
        ("ops/\u202efdp.exe", "U+202E"),  # shows as ops/exe.pdf
        ("ops/\u202aa\u202cb", "U+202A"),
        ("\u2066docs\u2069/x.md", "U+2066"),
        ("runbooks/\u2069x", "U+2069"),
        ("team/\u200binfra", "U+200B"),
        ("team/\ufeffinfra", "U+FEFF"),
        ("team/infra\U000e0069\U000e0067", "U+E0069"),  # tag characters: ASCII a model reads
    ],
)
def test_a_source_or_tag_with_a_bidi_control_or_invisible_character_is_refused(text, code_point):
    """QA: `ops/\\u202efdp.exe` was stored as a source and showed as `ops/exe.pdf` to
    whoever read it, in the console, the CLI and an agent's context. A source and a tag are
    refused with the field and the code point named; a title and a body keep such text."""
    said = re.escape(code_point)
    with pytest.raises(InvalidRequestError, match=f"^source contains {said} ") as refused:
        hygiene.check_format_characters(check_source(text), ())
    assert refused.value.details == {"field": "source", "code_point": code_point}
    tag = text.replace("/", "-")
    with pytest.raises(InvalidRequestError, match=f"^tag '.*' contains {said} ") as refused:
        hygiene.check_format_characters(None, check_tags(["ok", tag]))
    assert refused.value.details == {"field": "tags", "code_point": code_point}
    assert text not in str(refused.value)  # the message does not reorder itself
    assert check_title(text) == text
    assert check_body(text) == text


def test_a_format_character_the_memory_holds_already_is_not_judged_again():
    """QA: a memory whose source or tag took a bidi control before the rule (an older
    release) refused every edit, of its body alone too. What it holds it keeps; a new value
    with one, or another such tag beside those it holds, is refused."""
    legacy_source, legacy_tag = "ops/\u202efdp.exe", "ops-\u202edeploy"
    hygiene.check_format_characters(legacy_source, ["ok", legacy_tag], legacy_source, [legacy_tag])
    with pytest.raises(InvalidRequestError, match="^source contains U\\+202E "):
        hygiene.check_format_characters("ops/\u202egnp.exe", (), legacy_source, [legacy_tag])
    with pytest.raises(InvalidRequestError, match="contains U\\+200B ") as refused:
        hygiene.check_format_characters(
            legacy_source, [legacy_tag, "a\u200bb"], legacy_source, [legacy_tag]
        )
    assert refused.value.details == {"field": "tags", "code_point": "U+200B"}


@pytest.mark.parametrize("separator", ["\u2028", "\u2029"], ids=["LS", "PS"])
def test_a_line_separator_inside_a_source_is_refused_unless_the_memory_holds_it(separator):
    """QA: `docs/a\\u2028b.md` was accepted as a source, which is one line, while a tag
    refused it. Refused as new to a memory, naming it; one an older release stored stays
    through any other edit, as a bidi control does; at an end it is trimmed, as whitespace."""
    source = check_source(f" docs/a{separator}b.md")
    code_point = f"U+{ord(separator):04X}"
    at = re.escape(f"({code_point} at character 6)")
    said = rf"^source must be one line, without a line break {at}$"
    with pytest.raises(InvalidRequestError, match=said) as refused:
        hygiene.check_format_characters(source, ())
    assert refused.value.details == {"field": "source", "code_point": code_point}
    with pytest.raises(InvalidRequestError, match=said):
        hygiene.check_format_characters(source, (), "docs/ab.md")
    hygiene.check_format_characters(source, ["ok"], source)
    assert check_source(f"{separator}docs/a.md{separator}") == "docs/a.md"
    with pytest.raises(InvalidRequestError, match="whitespace"):
        check_tags([f"a{separator}b"])


def test_right_to_left_letters_in_a_source_or_tag_are_kept():
    assert check_source("docs/מדריך/התקנה.md") == "docs/מדריך/התקנה.md"
    assert check_tags(["عربي", "lang:עברית"]) == ("عربي", "lang:עברית")
    hygiene.check_format_characters("docs/מדריך/התקנה.md", ["عربي", "lang:עברית"])


def test_joiners_that_spell_words_and_emoji_in_a_source_or_tag_are_kept():
    """The joiners spell Persian and Indic words and emoji sequences; they reorder nothing.
    A backup holding such a tag must restore."""
    persian = "docs/می\u200cخواهم.md"  # ZWNJ inside a Persian word
    assert check_source(persian) == persian
    assert check_tags(["\U0001f469\u200d\U0001f4bb", "co\u00adop"]) == (
        "\U0001f469\u200d\U0001f4bb",
        "co\u00adop",
    )
    hygiene.check_format_characters(persian, ["\U0001f469\u200d\U0001f4bb", "co\u00adop"])
