"""`relay doctor`'s reading of the hook's own outcome log (through `relay.hook_stats`):
rejected keys, a server away, a deadline too short for this machine, the circuit breaker,
and the hook's time over the last 24 hours; first, whether the hook can write its state
folder at all (where that log, the sessions and the breaker live).

`LogChecks` is a part of `relay.doctor.Doctor`, kept apart to keep each module readable
in one sitting; it records its findings with the Doctor's `add`.
"""

from __future__ import annotations

import errno
import os
from typing import TYPE_CHECKING, Any

from relay.hook import config as hook_config

if TYPE_CHECKING:
    from pathlib import Path

    from relay import agents

BUDGET_ALERT_RUNS = 3  # runs out of budget before a search, in 24 h, worth a finding


class LogChecks:
    """The log part of the Doctor: what the hook's recent runs say went wrong."""

    environ: dict[str, str]
    cfg: hook_config.Config | None
    key_ok: bool | None

    if TYPE_CHECKING:

        def add(self, level: str, area: str, message: str, fix: str = "") -> None: ...
        def home(self, path: Path | str) -> str: ...
        def deadline_source(self) -> str: ...
        def _relay_entries(self) -> list[agents.RelayHandler]: ...

    def check_log(self) -> None:
        from relay import hook_stats

        cfg = self.cfg or hook_config.load(self.environ)
        self._check_state_dir(cfg.state_dir)
        summary = hook_stats.summarise(cfg.state_dir, 86400, cfg=cfg)
        if summary["invocations"] == 0 and not self._relay_entries():
            self.add(
                "warn",
                "log",
                "no prompts logged in the last 24 hours, and none will be: no agent has "
                "Relay's hook registered (see hooks above)",
            )
            return
        if summary["invocations"] == 0:
            self.add(
                "ok",
                "log",
                "no prompts in the last 24 hours; if you used an agent since installing, its "
                "hook is not running (Codex: trust it with /hooks)",
            )
            return
        streak = summary["unauthorized_streak"]
        if streak["length"]:
            key = f" with key {streak['key']}" if streak["key"] else ""
            self.add(
                "fail" if self.key_ok is not True else "warn",
                "log",
                f"the last {_searches(streak['length'])} rejected (401/403){key} since "
                f"{streak['since']}"
                + (
                    ""
                    if self.key_ok is not True
                    else "; the key works now, so the next prompt should too"
                ),
                "install a valid key: save it in a file, then `relay install --key-file FILE`"
                if self.key_ok is not True
                else "",
            )
        self._check_rejected_keys(summary)
        down = summary["unavailable_streak"]
        if down["length"] >= hook_stats.UNAVAILABLE_STREAK_ALERT:
            self.add(
                "warn",
                "log",
                f"the last {down['length']} searches timed out or found no server since "
                f"{down['since']}",
                "check the server and the network; `relay stats` has the details",
            )
        self._check_budget(summary)
        breaker = summary["breaker"]
        if breaker["state"] != "closed":
            failures = f"after {breaker.get('failures', 0)} failures"
            if breaker["state"] == "open":
                what = (
                    f"open ({failures}, since {breaker.get('opened_at')}): prompts skip their "
                    f"search for {cfg.breaker_cooldown_s:g} s from then, then one probes the server"
                )
            else:
                what = (
                    f"half-open ({failures}): its cool-down is over, and the next prompt's "
                    "search probes the server; an answer closes it, a failure opens it again"
                )
            self.add(
                "warn",
                "log",
                f"the hook's circuit breaker for {breaker['url']} is {what}",
                "it closes by itself once the server answers; fix the server if it does not",
            )
        p95 = summary["hook_ms"]["p95"]
        deadline = cfg.deadline_ms
        outcomes = summary["outcomes"]
        level = "warn" if p95 > deadline + 100 else "ok"
        self.add(
            level,
            "log",
            f"last 24 h: {summary['invocations']} runs, {outcomes['hit']} hits, "
            f"{outcomes['no_match']} no match, p95 hook time {p95} ms (deadline {deadline} ms)",
            "the machine is slow to start Python; see docs/hook.md, Measuring"
            if level == "warn"
            else "",
        )

    def _check_rejected_keys(self, summary: dict[str, Any]) -> None:
        """401s another key than the configured one got: the agent's environment set it
        (RELAY_API_KEY), which this shell may not show, or it was replaced since."""
        from relay import hook_stats

        configured = summary["unauthorized_streak"]["key"]
        for rejected in summary["rejected_keys"]:
            if rejected["from"]:
                self.add("warn", "log", hook_stats.env_key_problem(rejected, configured))
            else:
                self.add(
                    "ok",
                    "log",
                    f"key {rejected['key']} was rejected (401/403) on "
                    f"{hook_stats.last_searches(rejected['length'])} since {rejected['since']};"
                    f" it is not the configured key {configured}, which the next prompt sends",
                )

    def _check_budget(self, summary: dict[str, Any]) -> None:
        """A deadline too short for this machine: at least as many runs ran out of budget
        before they could search (`timeout`, `no_budget_left`) as searched; none searched
        at all is a failure (QA: RELAY_DEADLINE_MS=50 ran out on 6 prompts of 6)."""
        unsent = summary["not_searched"].get("timeout", 0)
        searched = sum(summary["searched"].values())
        if unsent < BUDGET_ALERT_RUNS or unsent < searched:
            return
        self.add(
            "fail" if searched == 0 else "warn",
            "log",
            f"{unsent} runs in the last 24 h ran out of budget before they could search "
            f"(timeout, no_budget_left) and {searched} searched: the hook's deadline is too "
            "short for how fast this machine starts it",
            f"raise {self.deadline_source()} (the default is "
            f"{hook_config.DEFAULTS['deadline_ms']} ms)",
        )

    def _check_state_dir(self, state_dir: str) -> None:
        """A state folder the hook cannot write (root's after `sudo claude`, a file in its
        place, a full disk): the hook still answers prompts, but with no session throttle or
        ledger (so records repeat), no breaker, and its log in a fallback folder."""
        from relay.hook.outcome_log import fallback_dir

        shown = self.home(state_dir)
        effect = (
            "every prompt is searched without its session's throttle and ledger (records "
            "repeat), with no circuit breaker, and the hook logs to "
            f"{fallback_dir(self.environ)} instead"
        )
        user = _user_name()
        where, why = _unwritable(state_dir) or (state_dir, None)
        if why == "not a folder":
            there = self.home(where)
            self.add(
                "fail",
                "state",
                f"the hook's state folder {shown} cannot be made: {there} is not a folder: "
                + effect,
                f"move it aside (`mv {there} {there}.bak`); the hook makes a new folder",
            )
        elif why is not None:
            self.add(
                "fail",
                "state",
                f"the hook cannot write its state folder {shown} ({why}): {effect}",
                f"free space on its disk (`df -h {self.home(where)}`)"
                if why == os.strerror(errno.ENOSPC)
                else f"`sudo chown -R {user} {shown}` (left by an agent run with sudo?)",
            )
        else:
            foreign = _foreign_files(state_dir)
            if foreign:
                self.add(
                    "warn",
                    "state",
                    f"{len(foreign)} files in the hook's state folder {shown} belong to "
                    f"another user (e.g. {self.home(foreign[0])}): the sessions they hold get "
                    "no throttle or ledger, and a log or breaker file among them is not written",
                    f"`sudo chown -R {user} {shown}` (left by an agent run with sudo?)",
                )


def _unwritable(state_dir: str) -> tuple[str, str] | None:
    """(where, why) the hook could not create files in `state_dir` or its `sessions/` (for
    one missing, in the nearest folder there, where it would create it); None when it could."""
    for path in (state_dir, os.path.join(state_dir, "sessions")):
        # Climbed as given, a relative folder ("relstate") reaches "", whose parent is "":
        # doctor never finished. Absolute, the climb stops at "/" (or any fixed point).
        path = os.path.abspath(path)
        while not os.path.lexists(path) and os.path.dirname(path) != path:
            path = os.path.dirname(path)
        if not os.path.isdir(path):
            return path, "not a folder"
        probe = os.path.join(path, f".relay-doctor-{os.getpid()}")
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:  # a byte too: on a full disk an empty file is still made, a line is not
                os.write(fd, b"\n")
            finally:
                os.close(fd)
                os.unlink(probe)
        except OSError as exc:
            return path, exc.strerror or type(exc).__name__
    return None


def _foreign_files(state_dir: str) -> list[str]:
    """Files of the state folder (and its sessions) another user owns, at most 1000 looked at."""
    uid, found = os.getuid(), []
    for folder in (state_dir, os.path.join(state_dir, "sessions")):
        try:
            with os.scandir(folder) as entries:
                for n, entry in enumerate(entries):
                    if n >= 1000:
                        break
                    if entry.stat(follow_symlinks=False).st_uid != uid:
                        found.append(entry.path)
        except OSError:
            continue
    return found


def _user_name() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def _searches(n: int) -> str:
    return "search was" if n == 1 else f"{n} searches were"
