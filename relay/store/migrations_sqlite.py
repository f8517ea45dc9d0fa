"""SQLite schema, as an ordered list of migrations recorded in `schema_migrations`.

Append new steps; never edit one that has shipped.
"""

# Migration 8's fill-in of the pins of revisions recorded before it (see there), as the
# table `walk` (org_id, id, revision, pinned). `relay migrate` computes the same for a source
# file no server of this version has opened, which it reads without upgrading it.
PIN_WALK = """
    WITH RECURSIVE walk(org_id, id, revision, pinned) AS (
        SELECT org_id, id, revision, pinned FROM memories WHERE deleted_at IS NULL
        UNION ALL
        SELECT w.org_id, w.id, w.revision - 1, 1 - w.pinned FROM walk w
        JOIN memory_revisions a
            ON a.org_id = w.org_id AND a.id = w.id AND a.revision = w.revision
        JOIN memory_revisions b
            ON b.org_id = w.org_id AND b.id = w.id AND b.revision = w.revision - 1
        WHERE a.title IS b.title AND a.body IS b.body AND a.source IS b.source
            AND a.tags IS b.tags AND a.audiences IS b.audiences
            AND a.valid_until IS b.valid_until AND a.supersedes IS b.supersedes
    )
"""

MIGRATIONS: list[str] = [
    # 1: the whole first schema
    """
    CREATE TABLE orgs (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        created_at REAL NOT NULL,
        generation INTEGER NOT NULL DEFAULT 0,
        passage_count INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE api_keys (
        id TEXT PRIMARY KEY,
        org_id TEXT NOT NULL REFERENCES orgs(id),
        secret_hash TEXT NOT NULL,
        name TEXT NOT NULL,
        scopes TEXT NOT NULL,
        roles TEXT NOT NULL,
        created_at REAL NOT NULL,
        expires_at REAL,
        revoked_at REAL
    );
    CREATE INDEX api_keys_org ON api_keys(org_id);
    CREATE TABLE memories (
        org_id TEXT NOT NULL REFERENCES orgs(id),
        id TEXT NOT NULL,
        revision INTEGER NOT NULL,
        title TEXT,
        body TEXT,
        source TEXT,
        tags TEXT NOT NULL DEFAULT '[]',
        audiences TEXT NOT NULL DEFAULT '["all"]',
        author TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        valid_until REAL,
        supersedes TEXT NOT NULL DEFAULT '[]',
        superseded_by TEXT,
        pinned INTEGER NOT NULL DEFAULT 0,
        deleted_at REAL,
        PRIMARY KEY (org_id, id)
    );
    CREATE INDEX memories_org_updated ON memories(org_id, updated_at);
    CREATE INDEX memories_org_source ON memories(org_id, source);
    CREATE TABLE memory_audiences (
        org_id TEXT NOT NULL,
        memory_id TEXT NOT NULL,
        audience TEXT NOT NULL,
        PRIMARY KEY (org_id, memory_id, audience)
    );
    CREATE TABLE memory_revisions (
        org_id TEXT NOT NULL,
        id TEXT NOT NULL,
        revision INTEGER NOT NULL,
        action TEXT NOT NULL,
        recorded_at REAL NOT NULL,
        author TEXT,
        title TEXT,
        body TEXT,
        source TEXT,
        tags TEXT,
        audiences TEXT,
        valid_until REAL,
        supersedes TEXT,
        PRIMARY KEY (org_id, id, revision)
    );
    CREATE TABLE passages (
        rowid INTEGER PRIMARY KEY,
        org_id TEXT NOT NULL,
        memory_id TEXT NOT NULL,
        revision INTEGER NOT NULL,
        seq INTEGER NOT NULL,
        text TEXT NOT NULL,
        lexical TEXT NOT NULL,
        content_hash TEXT NOT NULL,
        embedding BLOB NOT NULL
    );
    CREATE INDEX passages_memory ON passages(org_id, memory_id);
    CREATE VIRTUAL TABLE passages_fts USING fts5(
        lexical, content='passages', content_rowid='rowid', tokenize='unicode61 remove_diacritics 2'
    );
    CREATE TRIGGER passages_ai AFTER INSERT ON passages BEGIN
        INSERT INTO passages_fts(rowid, lexical) VALUES (new.rowid, new.lexical);
    END;
    CREATE TRIGGER passages_ad AFTER DELETE ON passages BEGIN
        INSERT INTO passages_fts(passages_fts, rowid, lexical)
            VALUES ('delete', old.rowid, old.lexical);
    END;
    CREATE TABLE org_terms (
        org_id TEXT NOT NULL,
        term TEXT NOT NULL,
        df INTEGER NOT NULL,
        PRIMARY KEY (org_id, term)
    ) WITHOUT ROWID;
    CREATE TABLE embedding_cache (
        model TEXT NOT NULL,
        content_hash TEXT NOT NULL,
        embedding BLOB NOT NULL,
        PRIMARY KEY (model, content_hash)
    ) WITHOUT ROWID;
    """,
    # 2: clearing supersession on every write looked up superseded_by with a full scan
    """
    CREATE INDEX memories_superseded_by ON memories(org_id, superseded_by)
        WHERE superseded_by IS NOT NULL;
    """,
    # 3: the org id becomes an indexed FTS column, so a query intersects the org's posting
    # list inside FTS5 and ranks only the org's matches (before, every match of every org
    # was joined to its memory row before the access filter could drop it)
    """
    DROP TRIGGER passages_ai;
    DROP TRIGGER passages_ad;
    DROP TABLE passages_fts;
    CREATE VIRTUAL TABLE passages_fts USING fts5(
        lexical, org_id, content='passages', content_rowid='rowid',
        tokenize='unicode61 remove_diacritics 2'
    );
    INSERT INTO passages_fts(passages_fts) VALUES ('rebuild');
    CREATE TRIGGER passages_ai AFTER INSERT ON passages BEGIN
        INSERT INTO passages_fts(rowid, lexical, org_id)
            VALUES (new.rowid, new.lexical, new.org_id);
    END;
    CREATE TRIGGER passages_ad AFTER DELETE ON passages BEGIN
        INSERT INTO passages_fts(passages_fts, rowid, lexical, org_id)
            VALUES ('delete', old.rowid, old.lexical, old.org_id);
    END;
    CREATE INDEX memories_org_valid_until ON memories(org_id, valid_until)
        WHERE valid_until IS NOT NULL;
    """,
    # 4: each passage's token matrix for late interaction (relay.late), in its own table so
    # the passage rows that vector loads scan stay small; passages stored before this get
    # theirs from the server's backfill (relay.writes.backfill_tokens)
    """
    CREATE TABLE passage_tokens (
        rowid INTEGER PRIMARY KEY REFERENCES passages(rowid) ON DELETE CASCADE,
        tokens BLOB NOT NULL
    );
    """,
    # 5: the passages of each audience set (the sorted, distinct audiences of a memory, as a
    # JSON array: `sqlite._audience_key`), kept with the passages in the same transaction
    # (`sqlite._update_terms`). A reader's total is the sum over the sets that meet its
    # audiences, one small read: search weighed words against the org's total, which moves
    # with writes the reader may not see. The backfill counts the passages there are (the
    # window's ORDER BY, unlike a subquery's, fixes the order json_group_array sees).
    """
    CREATE TABLE audience_totals (
        org_id TEXT NOT NULL,
        audiences TEXT NOT NULL,
        passage_count INTEGER NOT NULL,
        PRIMARY KEY (org_id, audiences)
    ) WITHOUT ROWID;
    INSERT INTO audience_totals (org_id, audiences, passage_count)
    SELECT p.org_id, coalesce(s.audiences, '[]'), count(*) FROM passages p
    LEFT JOIN (
        SELECT DISTINCT org_id, memory_id, json_group_array(audience) OVER (
            PARTITION BY org_id, memory_id ORDER BY audience
            ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING
        ) AS audiences FROM memory_audiences
    ) AS s ON s.org_id = p.org_id AND s.memory_id = p.memory_id
    GROUP BY p.org_id, coalesce(s.audiences, '[]');
    """,
    # 6: a deleted or replaced passage's embedding leaves the cache with it (DESIGN: deletion
    # "removes it from every index and cache at once"): the cache keeps the vectors of texts
    # some passage still holds (`sqlite._forget_embeddings`), found through this index, and
    # what deletes left behind before is dropped here.
    """
    CREATE INDEX passages_content_hash ON passages(content_hash);
    DELETE FROM embedding_cache WHERE NOT EXISTS
        (SELECT 1 FROM passages p WHERE p.content_hash = embedding_cache.content_hash);
    """,
    # 7: the hook outcomes developers send (`POST /v1/hook-outcomes`), which lived in the
    # memory of the server process that took them: a restart lost them. Kept per (key,
    # developer name), in arrival order (`id`); each sender's newest is marked `latest`, so
    # the caps of `relay.models`, held in the write's transaction (`sqlite.reports`), look at
    # one row per sender, not at every report kept.
    """
    CREATE TABLE hook_outcomes (
        id INTEGER PRIMARY KEY,
        org_id TEXT NOT NULL REFERENCES orgs(id),
        key_id TEXT NOT NULL,
        developer TEXT NOT NULL,
        received_at REAL NOT NULL,
        period_since TEXT,
        period_until TEXT,
        invocations INTEGER NOT NULL,
        outcomes TEXT NOT NULL,
        unauthorized_streak INTEGER NOT NULL,
        unauthorized_since TEXT,
        unavailable_streak INTEGER NOT NULL,
        unavailable_since TEXT,
        hook_ms TEXT NOT NULL,
        breaker TEXT,
        latest INTEGER NOT NULL DEFAULT 1
    );
    CREATE INDEX hook_outcomes_sender ON hook_outcomes(org_id, key_id, developer, id);
    CREATE INDEX hook_outcomes_latest ON hook_outcomes(org_id, key_id, id) WHERE latest;
    """,
    # 8: each revision records whether it pinned the memory: a pin or unpin is an edit, so a
    # new revision, and without it such a revision showed nothing changed (`relay history`,
    # the console's compare). NULL: not known. The revisions recorded before are filled in
    # where they can be known: the current one's is the memory's, and going back from it,
    # a revision identical to the one before in every field recorded changed only the pin
    # (a write that changes nothing makes no revision), so the one before held the other
    # value. A deleted memory's text is gone from its revisions, so they cannot be compared.
    """
    ALTER TABLE memory_revisions ADD COLUMN pinned INTEGER;
    """
    + PIN_WALK
    + """
    UPDATE memory_revisions SET pinned = walk.pinned FROM walk
    WHERE walk.org_id = memory_revisions.org_id AND walk.id = memory_revisions.id
        AND walk.revision = memory_revisions.revision;
    """,
]
