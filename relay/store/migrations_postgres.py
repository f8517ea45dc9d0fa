"""PostgreSQL schema, as an ordered list of migrations recorded in `schema_migrations`.

Append new steps; never edit one that has shipped. Each step runs in one
transaction as the database owner (the URL's user), under an advisory lock so
replicas starting together migrate once. Grants to the application role are
re-applied after every run (see `GRANTS`), so a new table never lacks them.

Tenant isolation is enforced here a second time: every tenant table has Row-
Level Security with policies keyed on the per-transaction setting
`relay.org_id`, and the server works as the non-owner role `relay_app`, so a
query that forgets its `org_id = ...` filter sees nothing, not another
organisation's rows. Two narrow, read-only exceptions exist, each keyed on its
own per-transaction setting: `relay.key_id` shows exactly one API key
(authentication, which runs before the organisation is known) and
`relay.directory` lists organisations (administration). The embedding cache is
shared on purpose: it maps a content hash to a vector and carries no tenant.
`passage_tokens` has no org column: its policy follows its passage's (migration 3).

Why not FORCE ROW LEVEL SECURITY on the owner as well: under RLS PostgreSQL
may not use an index for an operator that is not LEAKPROOF, and the full-text
match `@@` is not, so a GIN index is useless to a role subject to RLS. The
lexical stage therefore runs in one SECURITY DEFINER function, owned by the
table owner, that reads its org from the same `relay.org_id` setting (it takes
no org argument), so it can only ever search the transaction's own org.
"""

APP_ROLE = "relay_app"

# Tables whose rows belong to one organisation, and the column naming it (in the first
# schema; a later table gets its policy in its own migration, as audience_totals does).
TENANT_TABLES: dict[str, str] = {
    "orgs": "id",
    "api_keys": "org_id",
    "memories": "org_id",
    "memory_audiences": "org_id",
    "memory_revisions": "org_id",
    "passages": "org_id",
    "org_terms": "org_id",
    "migration_progress": "org_id",
}

_TENANT = "current_setting('relay.org_id', true)"


def _rls(table: str, column: str) -> str:
    return f"""
    ALTER TABLE {table} ENABLE ROW LEVEL SECURITY;
    CREATE POLICY tenant ON {table} USING ({column} = {_TENANT}) WITH CHECK ({column} = {_TENANT});
    """


# BM25 over the org's own statistics (df from org_terms, lengths from passages),
# for the passages of the transaction's org that match any query term and that
# the reader may see. k1 = 1.2, b = 0.75.
def lexical_function(name: str, match_param: str, match_sql: str) -> str:
    """The BM25 function, for one way of finding the org's passages that match."""
    match_type = match_param.split()[1]
    return f"""
CREATE FUNCTION {name}(
    {match_param}, terms text[], n float8, avgdl float8, aud text[], at timestamptz, lim int
) RETURNS TABLE (id bigint, score float8)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    WITH org AS (SELECT current_setting('relay.org_id', true) AS id),
    q AS (
        SELECT t.term, ln(1 + (n - coalesce(ot.df, 0) + 0.5) / (coalesce(ot.df, 0) + 0.5)) AS idf
        FROM unnest(terms) AS t(term)
        LEFT JOIN org_terms ot ON ot.org_id = (SELECT id FROM org) AND ot.term = t.term
    ),
    matched AS MATERIALIZED (
        SELECT p.id, p.org_id, p.memory_id, p.tsv, p.token_count FROM passages p
        WHERE {match_sql} AND p.org_id = (SELECT id FROM org)
    ),
    hits AS (
        SELECT p.id, p.tsv, p.token_count FROM matched p
        JOIN memories m ON m.org_id = p.org_id AND m.id = p.memory_id
        WHERE m.deleted_at IS NULL AND m.superseded_by IS NULL
          AND (m.valid_until IS NULL OR m.valid_until > at)
          AND EXISTS (SELECT 1 FROM memory_audiences ma WHERE ma.org_id = m.org_id
                      AND ma.memory_id = m.id AND ma.audience = ANY(aud))
    )
    SELECT h.id, sum(q.idf * u.tf * 2.2 / (u.tf + 1.2 * (0.25 + 0.75 * h.token_count / avgdl)))
    FROM hits h
    CROSS JOIN LATERAL (
        SELECT lexeme, coalesce(array_length(positions, 1), 1)::float8 AS tf FROM unnest(h.tsv)
    ) AS u
    JOIN q ON q.term = u.lexeme
    GROUP BY h.id ORDER BY 2 DESC, h.id LIMIT lim
$$;
REVOKE ALL ON FUNCTION {name}({match_type}, text[], float8, float8, text[], timestamptz, int)
    FROM PUBLIC;
"""


LEXICAL_FUNCTION = lexical_function("relay_lexical", "match tsquery", "p.tsv @@ match")

# Migration 2 (issue 5): per-org access paths for the search stages, so an org's search
# touches its own rows only, however many other orgs share the table.
# - The tsvector's GIN index returns every org's matches (all of them rechecked on the
#   heap): an org holding 1% of the table paid for the other 99%. `relay_org_terms` keys
#   each lexeme by its org, so the GIN lookup finds the org's own matches alone. The old
#   index and function stay, for replicas not yet upgraded (migrations only add).
# - The exact vector scan read each of the org's rows from a heap where they lie
#   scattered; the covering btree keeps the org's vectors together, for an index-only scan.
ORG_TERMS_FUNCTION = """
CREATE OR REPLACE FUNCTION relay_org_terms(org text, tsv tsvector) RETURNS text[]
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT array_agg(org || ' ' || l) FROM unnest(tsvector_to_array(tsv)) AS l $$;
"""
ORG_LEXICAL_FUNCTION = lexical_function(
    "relay_lexical_org",
    "chosen text[]",
    "relay_org_terms(p.org_id, p.tsv)"
    " && (SELECT array_agg(org.id || ' ' || c) FROM org, unnest(chosen) AS c)",
)

# Migration 3: token matrices for late interaction (relay.late), one per passage, apart
# from `passages` so the rows the vector stages scan stay narrow. They are tenant data
# without an org column of their own: the policy shows (and lets a writer add) a passage's
# matrix exactly when the passage itself is visible, i.e. under that passage's org. Rows go
# with their passage (ON DELETE CASCADE; the cascade runs as the owner, beneath the policy).
# The backfill works across orgs but reads text only under each org's own setting: these two
# functions reveal passage ids and their org ids, never content.
PASSAGE_TOKENS = """
CREATE TABLE passage_tokens (
    passage_id bigint PRIMARY KEY REFERENCES passages(id) ON DELETE CASCADE,
    tokens bytea NOT NULL
);
ALTER TABLE passage_tokens ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant ON passage_tokens
    USING (EXISTS (SELECT 1 FROM passages p WHERE p.id = passage_id))
    WITH CHECK (EXISTS (SELECT 1 FROM passages p WHERE p.id = passage_id));
CREATE FUNCTION relay_missing_tokens(lim int) RETURNS TABLE (id bigint, org_id text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT p.id, p.org_id FROM passages p
    WHERE NOT EXISTS (SELECT 1 FROM passage_tokens t WHERE t.passage_id = p.id)
    ORDER BY p.id LIMIT lim
$$;
REVOKE ALL ON FUNCTION relay_missing_tokens(int) FROM PUBLIC;
CREATE FUNCTION relay_passage_orgs(ids bigint[]) RETURNS TABLE (id bigint, org_id text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT p.id, p.org_id FROM passages p WHERE p.id = ANY(ids)
$$;
REVOKE ALL ON FUNCTION relay_passage_orgs(bigint[]) FROM PUBLIC;
"""

# The start-up drop of every cached embedding no passage holds (`forget_unheld_embeddings`),
# as the owner: every org's passages. Migration 6 has made it since e9cdae7; the migration 6
# that shipped before that commit did not, so migration 9 makes it where it is missing.
FORGET_UNHELD_EMBEDDINGS = """FUNCTION relay_forget_unheld_embeddings() RETURNS bigint
    LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT AS $$
        WITH gone AS (
            DELETE FROM embedding_cache c WHERE NOT EXISTS
                (SELECT 1 FROM passages p WHERE p.content_hash = c.content_hash)
            RETURNING 1
        ) SELECT count(*) FROM gone
    $$;
    REVOKE ALL ON FUNCTION relay_forget_unheld_embeddings() FROM PUBLIC;
    """

MIGRATIONS: list[str] = [
    # 1: the whole first schema
    """
    CREATE EXTENSION IF NOT EXISTS vector;
    CREATE TABLE orgs (
        id text COLLATE "C" PRIMARY KEY,
        name text NOT NULL UNIQUE,
        created_at timestamptz NOT NULL,
        generation bigint NOT NULL DEFAULT 0,
        passage_count bigint NOT NULL DEFAULT 0,
        token_count bigint NOT NULL DEFAULT 0
    );
    CREATE TABLE api_keys (
        id text COLLATE "C" PRIMARY KEY,
        org_id text COLLATE "C" NOT NULL REFERENCES orgs(id),
        secret_hash text NOT NULL,
        name text NOT NULL,
        scopes text[] NOT NULL,
        roles text[] NOT NULL,
        created_at timestamptz NOT NULL,
        expires_at timestamptz,
        revoked_at timestamptz
    );
    CREATE INDEX api_keys_org ON api_keys(org_id);
    CREATE TABLE memories (
        org_id text COLLATE "C" NOT NULL REFERENCES orgs(id),
        id text COLLATE "C" NOT NULL,
        revision integer NOT NULL,
        title text,
        body text,
        source text,
        tags text[] NOT NULL DEFAULT '{}',
        audiences text[] NOT NULL DEFAULT '{all}',
        author text,
        created_at timestamptz NOT NULL,
        updated_at timestamptz NOT NULL,
        valid_until timestamptz,
        supersedes text[] NOT NULL DEFAULT '{}',
        superseded_by text COLLATE "C",
        pinned boolean NOT NULL DEFAULT false,
        deleted_at timestamptz,
        PRIMARY KEY (org_id, id)
    );
    CREATE INDEX memories_org_updated ON memories(org_id, updated_at);
    CREATE INDEX memories_org_source ON memories(org_id, source);
    CREATE INDEX memories_org_superseded_by ON memories(org_id, superseded_by)
        WHERE superseded_by IS NOT NULL;
    CREATE TABLE memory_audiences (
        org_id text COLLATE "C" NOT NULL,
        memory_id text COLLATE "C" NOT NULL,
        audience text NOT NULL,
        PRIMARY KEY (org_id, memory_id, audience)
    );
    CREATE TABLE memory_revisions (
        org_id text COLLATE "C" NOT NULL,
        id text COLLATE "C" NOT NULL,
        revision integer NOT NULL,
        action text NOT NULL,
        recorded_at timestamptz NOT NULL,
        author text,
        title text,
        body text,
        source text,
        tags text[],
        audiences text[],
        valid_until timestamptz,
        supersedes text[],
        PRIMARY KEY (org_id, id, revision)
    );
    CREATE TABLE passages (
        id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
        org_id text COLLATE "C" NOT NULL,
        memory_id text COLLATE "C" NOT NULL,
        revision integer NOT NULL,
        seq integer NOT NULL,
        text text NOT NULL,
        lexical text NOT NULL,
        token_count integer NOT NULL,
        content_hash text NOT NULL,
        embedding vector(384) NOT NULL,
        tsv tsvector GENERATED ALWAYS AS (to_tsvector('simple'::regconfig, lexical)) STORED
    );
    -- Keep vectors in the row: an exact per-org scan should not chase TOAST pointers.
    ALTER TABLE passages ALTER COLUMN embedding SET STORAGE PLAIN;
    CREATE INDEX passages_memory ON passages(org_id, memory_id);
    CREATE INDEX passages_tsv ON passages USING gin (tsv);
    CREATE INDEX passages_embedding ON passages USING hnsw (embedding vector_cosine_ops);
    CREATE TABLE org_terms (
        org_id text COLLATE "C" NOT NULL,
        term text NOT NULL,
        df integer NOT NULL,
        PRIMARY KEY (org_id, term)
    );
    CREATE TABLE embedding_cache (
        model text NOT NULL,
        content_hash text NOT NULL,
        embedding bytea NOT NULL,
        PRIMARY KEY (model, content_hash)
    );
    -- `relay migrate` records what it has copied, per organisation and table, to resume.
    CREATE TABLE migration_progress (
        org_id text COLLATE "C" NOT NULL,
        source text NOT NULL,
        step text NOT NULL,
        position text,
        done boolean NOT NULL DEFAULT false,
        updated_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (org_id, source, step)
    );
    """
    + "".join(_rls(t, c) for t, c in TENANT_TABLES.items())
    + """
    CREATE POLICY key_lookup ON api_keys FOR SELECT
        USING (id = current_setting('relay.key_id', true));
    CREATE POLICY directory ON orgs FOR SELECT
        USING (current_setting('relay.directory', true) = 'on');
    """
    + LEXICAL_FUNCTION,
    # 2: per-org access paths for the lexical and exact vector stages (see above)
    ORG_TERMS_FUNCTION
    + """
    CREATE INDEX IF NOT EXISTS passages_org_terms ON passages
        USING gin (relay_org_terms(org_id, tsv));
    CREATE INDEX IF NOT EXISTS passages_org_vectors ON passages (org_id) INCLUDE (id, embedding);
    """
    + ORG_LEXICAL_FUNCTION,
    # 3: token matrices for late interaction (see above)
    PASSAGE_TOKENS,
    # 4: the backfill resumes after the last passage it did instead of scanning the done ones
    # again on every batch (the one-argument function stays, for replicas not yet upgraded)
    """
    CREATE FUNCTION relay_missing_tokens(lim int, after bigint)
    RETURNS TABLE (id bigint, org_id text)
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
        SELECT p.id, p.org_id FROM passages p
        WHERE p.id > after
          AND NOT EXISTS (SELECT 1 FROM passage_tokens t WHERE t.passage_id = p.id)
        ORDER BY p.id LIMIT lim
    $$;
    REVOKE ALL ON FUNCTION relay_missing_tokens(int, bigint) FROM PUBLIC;
    """,
    # 5: the passages of each audience set (a memory's audiences, sorted bytewise and
    # distinct), kept with the passages in the same transaction (`postgres._TermDelta`). A
    # reader's total is the sum over the sets that meet its audiences, one small read:
    # search weighed words against the org's total, which moves with writes the reader may
    # not see. The backfill counts the passages there are.
    """
    CREATE TABLE audience_totals (
        org_id text COLLATE "C" NOT NULL,
        audiences text[] COLLATE "C" NOT NULL,
        passage_count bigint NOT NULL,
        PRIMARY KEY (org_id, audiences)
    );
    INSERT INTO audience_totals (org_id, audiences, passage_count)
    SELECT p.org_id, coalesce(s.audiences, '{}'), count(*) FROM passages p
    LEFT JOIN (
        SELECT org_id, memory_id, array_agg(audience COLLATE "C" ORDER BY audience COLLATE "C")
            AS audiences
        FROM memory_audiences GROUP BY org_id, memory_id
    ) AS s ON s.org_id = p.org_id AND s.memory_id = p.memory_id
    GROUP BY 1, 2;
    """
    + _rls("audience_totals", "org_id"),
    # 6: a deleted or replaced passage's embedding leaves the cache with it (DESIGN: deletion
    # "removes it from every index and cache at once"): the cache keeps the vectors of texts
    # some passage still holds (`postgres._forget_embeddings`), found through this index, and
    # what deletes left behind before is dropped here (as the owner: every org's passages).
    # The function looks at every org's passages (the app role sees its own org's alone), so
    # one org's delete never drops a vector another org's passage still stands on.
    """
    CREATE INDEX passages_content_hash ON passages (content_hash);
    DELETE FROM embedding_cache WHERE NOT EXISTS
        (SELECT 1 FROM passages p WHERE p.content_hash = embedding_cache.content_hash);
    CREATE FUNCTION relay_forget_embeddings(hashes text[]) RETURNS void
    LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT AS $$
        DELETE FROM embedding_cache c WHERE c.content_hash = ANY(hashes)
          AND NOT EXISTS (SELECT 1 FROM passages p WHERE p.content_hash = c.content_hash)
    $$;
    REVOKE ALL ON FUNCTION relay_forget_embeddings(text[]) FROM PUBLIC;
    CREATE """
    + FORGET_UNHELD_EMBEDDINGS,
    # 7: the hook outcomes developers send (`POST /v1/hook-outcomes`), which lived in the
    # memory of the replica that took them: the console showed them on that replica alone,
    # and a restart lost them. Kept per (key, developer name), in arrival order (`id`,
    # taken under the org's write lock); each sender's newest is marked `latest`, so the caps
    # of `relay.models`, held in the write's transaction (`postgres.reports`), look at one
    # row per sender, not at every report kept. Tenant data: the org's policy, like every table's;
    # the app role's grants come with `GRANTS`. `json`, not `jsonb`: it keeps the order of
    # the outcomes as the console shows them.
    """
    CREATE TABLE hook_outcomes (
        id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
        org_id text COLLATE "C" NOT NULL REFERENCES orgs(id),
        key_id text COLLATE "C" NOT NULL,
        developer text COLLATE "C" NOT NULL,
        received_at timestamptz NOT NULL,
        period_since text,
        period_until text,
        invocations integer NOT NULL,
        outcomes json NOT NULL,
        unauthorized_streak integer NOT NULL,
        unauthorized_since text,
        unavailable_streak integer NOT NULL,
        unavailable_since text,
        hook_ms json NOT NULL,
        breaker text,
        latest boolean NOT NULL DEFAULT true
    );
    CREATE INDEX hook_outcomes_sender ON hook_outcomes (org_id, key_id, developer, id);
    CREATE INDEX hook_outcomes_latest ON hook_outcomes (org_id, key_id, id) WHERE latest;
    """
    + _rls("hook_outcomes", "org_id"),
    # 8: each revision records whether it pinned the memory, filled in for the revisions
    # recorded before where that can be known (SQLite's migration 8 says how). NULL: not
    # known, as a replica on older code still writes it during a rolling upgrade.
    """
    ALTER TABLE memory_revisions ADD COLUMN pinned boolean;
    WITH RECURSIVE walk(org_id, id, revision, pinned) AS (
        SELECT org_id, id, revision, pinned FROM memories WHERE deleted_at IS NULL
        UNION ALL
        SELECT w.org_id, w.id, w.revision - 1, NOT w.pinned FROM walk w
        JOIN memory_revisions a
            ON a.org_id = w.org_id AND a.id = w.id AND a.revision = w.revision
        JOIN memory_revisions b
            ON b.org_id = w.org_id AND b.id = w.id AND b.revision = w.revision - 1
        WHERE (a.title, a.body, a.source, a.tags, a.audiences, a.valid_until, a.supersedes)
            IS NOT DISTINCT FROM
            (b.title, b.body, b.source, b.tags, b.audiences, b.valid_until, b.supersedes)
    )
    UPDATE memory_revisions r SET pinned = walk.pinned FROM walk
    WHERE r.org_id = walk.org_id AND r.id = walk.id AND r.revision = walk.revision;
    """,
    # 9: migration 6 as it first shipped made no relay_forget_unheld_embeddings(), so on a
    # database it migrated every start failed to drop the cached embeddings of deleted texts
    # (and logged a traceback saying so); made here where it is missing, as it is elsewhere.
    "CREATE OR REPLACE " + FORGET_UNHELD_EMBEDDINGS,
]

# Run after every migration pass; idempotent. The role itself is created when
# the owner may (see PostgresStore), otherwise an operator creates it once.
GRANTS = f"""
GRANT USAGE ON SCHEMA {{schema}} TO {APP_ROLE};
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {{schema}} TO {APP_ROLE};
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {{schema}} TO {APP_ROLE};
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {{schema}} TO {APP_ROLE};
"""
