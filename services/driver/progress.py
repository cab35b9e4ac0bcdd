"""Terminal progress: a tqdm bar on a TTY, plain throttled lines otherwise (logs, ray job logs)."""

from __future__ import annotations

import sys
import time
from typing import Any

from tqdm import tqdm

from ...contracts.config import CONFIG_FAMILIES, RelayConfig
from ...contracts.metrics import bottleneck

LINE_INTERVAL_S = 2.0


def _fmt_return(value: Any) -> str:
    return "n/a" if value is None else f"{value:.1f}"


class Progress:
    def __init__(self, cfg: RelayConfig, stream: Any = None) -> None:
        self.stream = stream or sys.stderr
        mode = cfg.metrics.progress
        if mode == "auto":
            mode = "bar" if self.stream.isatty() else "lines"
        self.mode = mode
        self._last_line = 0.0
        self._last: dict[str, Any] | None = None
        self._bar = None
        family = CONFIG_FAMILIES[cfg.family]  # its words: a language run counts tokens, scores rewards
        self.steps, self.steps_phrase, self.ret = family.steps_word, family.steps_phrase, family.return_word
        if mode == "bar":
            unit = self.steps.removesuffix("s")
            self._bar = tqdm(total=cfg.stop.env_steps, unit=unit, unit_scale=True, file=self.stream)

    def update(self, rec: dict[str, Any]) -> None:
        self._last = rec
        if self._bar is not None:
            self._bar.update(rec["env_steps"] - self._bar.n)
            self._bar.set_postfix(
                it=rec["iteration"],
                ret=_fmt_return(rec["episode_return_mean"]),
                sps=f"{rec['env_steps_per_s']:.0f}",
                busy=f"{rec.get('learner_busy', 0.0):.0%}",
                refresh=False,
            )
        elif self.mode == "lines" and time.monotonic() - self._last_line >= LINE_INTERVAL_S:
            self._last_line = time.monotonic()
            busy = rec.get("learner_busy", 0.0)
            print(
                f"iter {rec['iteration']:5d}  {self.steps} {rec['env_steps']:9d}  "
                f"{self.ret} {_fmt_return(rec['episode_return_mean']):>7}  "
                f"{self.steps}/s {rec['env_steps_per_s']:8.0f}  wall {rec['wall_s']:7.1f}s  "
                f"learner busy {busy:4.0%} ({bottleneck(busy)})",
                file=self.stream,
                flush=True,
            )

    def close(self, reason: str | None) -> None:
        if self._bar is not None:
            self._bar.close()
        if self.mode == "none":
            return
        where = ""
        if self._last is not None:  # where the run ended, so the last throttled line is not all
            r = self._last
            where = (
                f" at iteration {r['iteration']}, {r['env_steps']:,} {self.steps_phrase}, "
                f"{self.ret} {_fmt_return(r['episode_return_mean'])}, {r['wall_s']:.1f}s"
            )
        print(f"stopped: {reason or 'error'}{where}", file=self.stream, flush=True)
