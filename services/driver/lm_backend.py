"""The backend of a language run (`model.kind: causal_lm`): each round the learner generates
learner.group_size completions for prompts.batch_size prompts on its device, the rewards score
them on CPU actors (this process in local mode), and the learner trains on them.

It is a `Backend` like the env backends (`services/driver/backends.py`), so the driver loop,
checkpoints, resume, the dashboard and tracking are the same code. In a language run an
"episode" is a completion (its return is its reward) and an env step is a completion token.
"""

from __future__ import annotations

import secrets
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import ray

from ...contracts.config import RelayConfig
from ...contracts.metrics import REWARD_FAULT_KINDS
from ...contracts.prompts import rewards_input
from ...contracts.rounds import RoundResult
from ...learner.lm.settings import lm_settings, sharded_checkpoints
from ...rollout_workers.evaluator import EvalReport
from ...rollout_workers.lm.generator import create_generators, generator_count
from ...rollout_workers.lm.reward_scaling import RewardScaling
from ...rollout_workers.lm.reward_workers import RewardPool
from ...rollout_workers.lm.rewards import Scored, completion_text
from ...rollout_workers.lm.rounds import groups_to_keep, reward_means
from ...services.driver.cluster import wait_until_placed
from ...services.driver.evaluations import EvalRunner
from ...services.driver.lm_learner import LanguageLearnerProxy
from ...services.runs.signals import signals_held

SAMPLES = 4  # completions per iteration kept in RUN/samples.jsonl


@dataclass
class _Training:
    """A round whose update was submitted to the learner actor: the call, what the round's line
    is made of, and (once counted) its result."""

    ref: Any
    gens: list[dict[str, Any]]
    scores: list[Scored]
    reward_s: float
    gen_s: float
    started: float  # when the update was submitted (perf_counter)
    out: RoundResult | None = None
    metrics: dict[str, Any] | None = None  # the update's, where it ran in this process (local mode)
    waited: float = 0.0  # seconds the learner waited for the round's completions and rewards


@dataclass
class _Dispatched:
    """A round handed to the generator actors: every learner rank's `prepare_round` (object refs
    until fetched; rank 0's is the round the generators sample), the generators' calls on it, and
    when they were made (perf_counter)."""

    batches: list[Any]
    refs: list[Any]
    started: float


@dataclass
class _Prefetched:
    """The next round, generated, scored and handed to the learner while this one trained
    (generation.max_staleness=1), so the next update starts without waiting for them; its
    generation seconds are the generators' own (`gen["gen_s"]`)."""

    gen: dict[str, Any]
    scores: Scored
    reward_s: float


class WeightSyncError(RuntimeError):
    """A generator that failed to load a version of the weights twice (one line)."""


def sync_generators(
    generators: list[Any], version: int, publish: Callable[[], Any]
) -> tuple[dict[str, float | int], int]:
    """Every generator loads weights `version` (`publish()`: the learner's object ref of its
    (version, payload)). A generator whose load fails (a payload of another version, or weights
    that do not load, refused before anything changes) is sent them once more from a fresh
    publish; a second failure is WeightSyncError naming it. A generator that died is the
    caller's (RayActorError). Returns the sync's seconds and bytes, and the retries made."""
    t0 = time.perf_counter()
    ref = publish()
    pending = {i: g.set_weights.remote(version, [ref]) for i, g in enumerate(generators)}
    got: dict[int, tuple[float, int]] = {}
    retries = 0
    for attempt in range(2):
        failed: dict[int, BaseException] = {}
        for i, call in pending.items():
            try:
                got[i] = ray.get(call)
            except ray.exceptions.RayActorError:
                raise
            except ray.exceptions.RayTaskError as err:
                failed[i] = err.cause if err.cause is not None else err
        if not failed:
            break
        if attempt == 1:
            i, cause = next(iter(failed.items()))
            why = next((ln for ln in str(cause).splitlines() if ln.strip()), "")[:200]
            raise WeightSyncError(
                f"generator {i} failed twice to load weights version {version}: {type(cause).__name__}: {why}"
            )
        retries += len(failed)
        ref = publish()
        pending = {i: generators[i].set_weights.remote(version, [ref]) for i in failed}
    return {
        "weight_sync_s": time.perf_counter() - t0,
        "weight_sync_bytes": sum(b for _, b in got.values()),
    }, retries


class LanguageBackend:
    """Generation and updates on the learner, rewards on CPU actors (see the module docstring)."""

    @staticmethod
    def actors_per_worker(cfg: RelayConfig) -> int:
        """Actors of rollout.num_cpus_per_worker CPUs per rollout worker: the reward actor, and a
        generator beside it where generation.placement=workers."""
        return 1 + (generator_count(cfg) > 0)

    def __init__(self, cfg: RelayConfig, spec: None = None) -> None:
        self.cfg = cfg
        self.env_spec = None  # a language run has no env (its checkpoints record none)
        self.sharded_checkpoints = sharded_checkpoints(cfg)
        self.remote = cfg.rollout.num_workers > 0
        self.learner: LanguageLearnerProxy | None = None
        self.rewards: RewardPool | None = None
        self.generators: list[Any] = []
        self.version = 0
        # generation.max_staleness=1: the next round's generation, dispatched before this round's
        # update, and the weights sync that follows it on the generators.
        self.overlap = cfg.generation.max_staleness > 0
        self._inflight: _Dispatched | None = None
        self._ready: _Prefetched | None = None  # the round after the one training, scored
        self.weight_sync_retries = 0  # generators' failed loads, each sent the weights again
        self._accepts: list[Any] = []  # accept_generated calls queued on the learner, not yet checked
        self._syncing: list[Any] = []
        self._training: _Training | None = None  # the round `step` submitted, until `taken`
        self.completions = 0
        self.reward_faults = dict.fromkeys(REWARD_FAULT_KINDS, 0)
        self.reward_scaling = RewardScaling(cfg.prompts.reward_norm, cfg.prompts.reward_clip)
        self._warned: set[str] = set()
        try:
            self.learner = LanguageLearnerProxy(cfg, self.remote)
            self.rewards = RewardPool(cfg)
            if generator_count(cfg):
                self.generators = create_generators(cfg)
            if self.remote:  # the learner group is placed first (as an env run's is)
                wait_until_placed(cfg, {"rollout worker": self.rewards.actors + self.generators})
            if self.generators:
                self._sync_weights()
        except BaseException:
            self.close()
            raise

    @property
    def _learner(self) -> LanguageLearnerProxy:
        """The learner, while the backend is open."""
        assert self.learner is not None, "the language backend is closed"
        return self.learner

    @property
    def num_workers(self) -> int:
        return 0 if self.rewards is None else len(self.rewards.actors)

    def describe(self) -> dict[str, Any]:
        info = self._learner.describe()
        n, g = self.num_workers, len(self.generators)
        fleet = f"{n} reward worker{'s' * (n != 1)}" + f", {g} generator{'s' * (g != 1)}" * (g > 0)
        ranks = len(self._learner.group) if self._learner.group is not None else 1
        fleet += f", {ranks} learner rank{'s' * (ranks != 1)}"
        mode = "language" + ("" if self.remote else " (local)")
        return {"mode": mode, "workers": n, "fleet": fleet, **info}

    def _sync_weights(self, wait: bool = True) -> dict[str, float | int]:
        """Send the learner's weights to every generator, once per version: the seconds it took
        (`weight_sync_s`) and the bytes the generators received (`weight_sync_bytes`). wait=False
        (overlap): the sync is queued behind each generator's round in flight and the next
        `_receive` reports the generators' own seconds."""
        if not wait:
            ref = self._learner.weights_ref()  # bf16 in the learner's object: one copy, fetched by each
            self._syncing = [g.set_weights.remote(self.version, [ref]) for g in self.generators]
            return {}
        metrics, retried = sync_generators(self.generators, self.version, self._learner.weights_ref)
        self.weight_sync_retries += retried
        return metrics

    def _synced(self) -> dict[str, Any]:
        """The overlapped sync's figures, as the generators timed it; a generator whose load
        failed gets the weights again here (`sync_generators`)."""
        try:
            synced = ray.get(self._syncing)
        except ray.exceptions.RayActorError:
            raise
        except ray.exceptions.RayTaskError:
            # The generator refused the last version's weights, so the round it was to sample
            # with them failed too: dropped (as a restore drops it), and this version sent anew.
            self.weight_sync_retries += 1
            self._inflight = self._ready = None
            metrics, retried = sync_generators(self.generators, self.version, self._learner.weights_ref)
            self.weight_sync_retries += retried
            return metrics
        return {
            "weight_sync_s": max(float(s) for s, _ in synced) if synced else None,
            "weight_sync_bytes": sum(int(b) for _, b in synced),
        }

    def _dispatch(self) -> _Dispatched:
        """The learner's next prompts handed to the generators, whole groups each, to sample with
        the weights version they hold. Nothing is waited for: each generator takes the learner's
        prepared round as an object ref and starts once the learner has made it."""
        t0 = time.perf_counter()
        batches = self._learner.prepare_round_refs()
        batch = batches[0]
        g = self.cfg.learner.group_size
        groups, k = self.cfg.prompts.batch_size, len(self.generators)
        bounds = [(i * groups // k * g, (i + 1) * groups // k * g) for i in range(k)]
        refs = [
            gen.generate_rows.remote(self.version, batch, lo, hi)
            for gen, (lo, hi) in zip(self.generators, bounds, strict=True)
            if hi > lo
        ]
        return _Dispatched(batches, refs, t0)

    def _fetch(self, sent: _Dispatched) -> dict[str, Any]:
        """A dispatched round's completions as the rewards take them. Its generation seconds: the
        wall since dispatch, or under overlap (the update ran meanwhile) the slowest generator's
        own."""
        batch = self._learner.answer(sent.batches)[0]
        parts = ray.get(sent.refs)
        gen_s = (
            max(float(p["seconds"]) for p in parts) if self.overlap else time.perf_counter() - sent.started
        )
        return rewards_input(
            batch["prompts"],
            batch["columns"],
            [ids for p in parts for ids in p["completion_ids"]],
            [t for p in parts for t in p["texts"]],
            [bool(e) for p in parts for e in p["ended"]],
            gen_s,
            int(batch["ids"].shape[1]),
        )

    def _accept(self, sent: _Dispatched) -> None:
        """Queue the dispatched round's completions on the learner (the parts travel from the
        generators' objects, not through this process); `step` surfaces its errors before the
        update's."""
        self._accepts += self._learner.accept_generated_refs(sent.refs)

    def _generate_on_workers(self) -> dict[str, Any]:
        """The round the generators sample: the one in flight, or one dispatched now."""
        sent = self._inflight or self._dispatch()
        gen = self._fetch(sent)
        self._accept(sent)
        self._inflight = None
        return gen

    def _prefetch(self) -> None:
        """While the learner trains: the next round's completions (dispatched before the update),
        scored and queued on the learner behind the update. A failure here is left for the next
        round's collection to meet again, where it has always surfaced."""
        sent = self._inflight
        if sent is None:
            return
        try:
            gen = self._fetch(sent)
            scores, reward_s = self._score(gen)
        except Exception:
            return
        self._accept(sent)
        self._ready, self._inflight = _Prefetched(gen, scores, reward_s), None

    def _score(self, gen: dict[str, Any]) -> tuple[Scored, float]:
        """A generated round (`rewards_input`) scored by the run's rewards, and the seconds it took."""
        assert self.rewards is not None
        t0 = time.perf_counter()
        scores = self.rewards.score(gen["prompts"], gen["completions"], gen["columns"], gen["completion_ids"])
        return scores, time.perf_counter() - t0

    def _collect(self) -> tuple[list[dict[str, Any]], list[Scored], list[float | None], float, float]:
        """(the round's generations, their scores, the rewards of the completions to train on,
        generation seconds, reward seconds). With learner.lm.drop_equal_groups and refill_rounds,
        groups whose rewards are all equal are replaced by groups of up to refill_rounds more
        generations (DAPO's dynamic sampling); the batch keeps its prompts.batch_size groups (all-
        equal ones fill it when no more come, and carry no advantage)."""
        gc, g, q = lm_settings(self.cfg), self.cfg.learner.group_size, self.cfg.prompts.batch_size
        attempts = 1 + (gc.refill_rounds if gc.drop_equal_groups else 0)
        gens: list[dict[str, Any]] = []
        scores: list[Scored] = []
        train_rewards: list[float | None] = []
        gen_s = reward_s = 0.0
        for attempt in range(attempts):
            ready, self._ready = self._ready, None
            if ready is not None:  # generated and scored while the last round trained
                gen, sc = ready.gen, ready.scores
                gen_s, reward_s = gen_s + ready.gen["gen_s"], reward_s + ready.reward_s
            else:
                t0 = time.perf_counter()
                gen = self._generate_on_workers() if self.generators else self._learner.generate_round()
                t1 = time.perf_counter()
                sc, scored_s = self._score(gen)
                gen_s, reward_s = gen_s + t1 - t0, reward_s + scored_s
            gens.append(gen)
            scores.append(sc)
            if attempts == 1:
                return gens, scores, sc.rewards, gen_s, reward_s
            take = groups_to_keep(sc.rewards, g, q - len(train_rewards) // g, attempt == attempts - 1)
            self._learner.keep(take)
            train_rewards += [r for k in take for r in sc.rewards[k * g : (k + 1) * g]]
            if len(train_rewards) == q * g:
                break
        return gens, scores, train_rewards, gen_s, reward_s

    def step(self, progress: float, ahead: bool = False, state_after: bool = False) -> RoundResult:
        """One GRPO step (`ahead` and `state_after` are for env rounds: a language run overlaps by
        generation.max_staleness, generating the next round while this one trains)."""
        self._training = None  # the caller asks for the next round: it counted the last one
        t0 = time.perf_counter()
        gens, scores, train_rewards, gen_s, reward_s = self._collect()
        if self.overlap:  # round k+1 samples with the weights round k trains (one version stale)
            self._inflight = self._dispatch()
        t2 = time.perf_counter()
        if not self.remote:
            # The update runs in this thread: a stop waits for it (cut halfway, it would leave
            # weights between two versions), and `drain` counts its round.
            with signals_held():
                metrics = self._learner.train(self._scaled(train_rewards))
                self._training = _Training(None, gens, scores, reward_s, gen_s, t2, metrics=metrics)
        else:
            accepts, self._accepts = self._accepts, []  # this round's, queued before its update
            with signals_held():  # submitted and recorded as one (see RayBackend._submit)
                call = self._learner.submit_train(self._scaled(train_rewards))
                self._training = _Training(call, gens, scores, reward_s, gen_s, t2, waited=t2 - t0)
            if self.overlap:
                self._prefetch()
            for ref in accepts:  # done before the update began: an error of theirs comes first
                self._learner.answer(ref)
            metrics = self._learner.answer(self._training.ref)[0]  # rank 0's: the round's
        metrics.update(self.reward_scaling.metrics())
        if self.generators:
            self.version = int(metrics["weights_version"])
            if self.overlap:
                # The last version's sync is done by now (each generator loads it before sampling
                # the round just dispatched): its seconds as the generators timed them.
                synced = self._synced()
                self._sync_weights(wait=False)
                metrics.update(synced)
            else:
                metrics.update(self._sync_weights())
            metrics["weight_sync_retries"] = self.weight_sync_retries
        return self._count(self._training or _Training(None, gens, scores, reward_s, gen_s, t2), metrics)

    def _scaled(self, rewards: list[float | None]) -> list[float | None]:
        """What the update trains on (prompts.reward_norm, reward_clip; the metrics keep the
        scores). Called with the stop signals held, with the update it feeds: the running moments
        never take a round that was not trained."""
        return self.reward_scaling(rewards)

    def _count(self, round_: _Training, metrics: dict[str, Any]) -> RoundResult:
        """The round's result, its completions and reward faults counted with stop signals held,
        and kept on the round for `drain` (which returns it rather than count it again) until the
        loop has `taken` it."""
        with signals_held():
            round_.out = self._result(round_, metrics)
        return round_.out

    def _result(self, round_: _Training, metrics: dict[str, Any]) -> RoundResult:
        gens, scores = round_.gens, round_.scores
        skipped = int(metrics.pop("amp_skipped", 0))
        t3 = time.perf_counter()
        sc = Scored.concat(scores)
        for kind, count in sc.faults.items():
            self.reward_faults[kind] += count
        for note in sc.notes:
            key = " ".join(note.split(" ", 2)[:2])
            if key not in self._warned:  # each kind of fault said once, counted always
                self._warned.add(key)
                print(f"relay: {note} (counted in reward_faults; said once)", file=sys.stderr, flush=True)
        lengths = [n for gen in gens for n in gen["lengths"]]
        ended = [e for gen in gens for e in gen["ended"]]
        n = len(sc.rewards)
        self.completions += n
        scored = [(r, length) for r, length in zip(sc.rewards, lengths, strict=True) if r is not None]
        values = [r for r, _ in scored]
        mean = sum(values) / len(values) if values else None
        gen_tokens = sum(int(gen["gen_tokens"]) for gen in gens)
        gen_s, reward_s = round_.gen_s, round_.reward_s
        line = {
            **metrics,
            "reward_mean": mean,
            "reward_std": (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5
            if mean is not None
            else None,
            "completions": self.completions,
            "completion_len_mean": sum(lengths) / max(n, 1),
            "truncated_fraction": 1.0 - sum(ended) / max(n, 1),
            "gen_s": gen_s,
            "reward_s": reward_s,
            "gen_tokens_per_s": gen_tokens / max(sum(gen["gen_s"] for gen in gens), 1e-9),
            "prompt_width": gens[-1]["prompt_width"],
            "refill_rounds": len(gens) - 1,
            **reward_means(sc.per_reward),
            "reward_faults": sum(self.reward_faults.values()),
            **{f"reward_faults_{k}": v for k, v in self.reward_faults.items()},
        }
        return RoundResult(
            env_steps=gen_tokens,
            episode_returns=values,
            episode_lengths=[int(length) for _, length in scored],
            metrics=line,
            amp_skipped_steps=skipped,
            samples=self._samples(gens[0], scores[0].rewards),
            # The learner computes while it generates (placement=learner) and while it updates; it
            # waits for rewards, and for generator actors where they sample (under overlap, only
            # for what was not ready when its last update ended).
            phases={
                "update_s": (0.0 if self.generators else gen_s) + (t3 - round_.started),
                "wait_s": round_.waited if self.generators else reward_s,
            },
        )

    def _samples(self, gen: dict[str, Any], rewards: list[float | None]) -> list[dict[str, Any]]:
        """The first member of each of the round's first SAMPLES prompts, for people to read."""
        g = self.cfg.learner.group_size
        rows = range(0, min(len(rewards), SAMPLES * g), g)
        return [
            {
                "prompt": gen["prompts"][i],
                "completion": completion_text(gen["completions"][i]),
                "reward": rewards[i],
            }
            for i in rows
        ]

    def drain(self, timeout_s: float | None = None) -> RoundResult | None:
        """The round whose update a stop interrupted (the learner finishes it: its state would
        count an update no line does) or kept the loop from counting, or None. Its weights are
        not sent to the generators: the run is ending."""
        pending = self._training
        if pending is None:
            return None
        if pending.out is not None:
            return pending.out
        if pending.metrics is not None:
            return self._count(pending, pending.metrics)
        return self._count(pending, self._learner.answer(pending.ref, timeout_s)[0])

    def taken(self) -> None:
        self._training = None

    def stop_sampling(self) -> None:
        pass  # generation runs inside step(): a stop already interrupted it

    def worker_pids(self) -> list[int]:
        return []

    def state_dict(self, timeout_s: float | None = None, shards: Path | None = None) -> dict[str, Any]:
        # Under overlap the next round's prompts are out being generated: not trained, not counted.
        in_flight = self._inflight is not None or self._ready is not None
        state = self._learner.state_dict(in_flight, timeout_s, None if shards is None else str(shards))
        return {
            **state,
            "completions": self.completions,
            "reward_faults": dict(self.reward_faults),
            "reward_scaling": self.reward_scaling.state_dict(),
        }

    def storage_problem(self, root: Path) -> str | None:
        """Why this run's sharded checkpoints could not be written under `root` (a learner rank on
        a node that does not see the driver's storage there), or None. A probe file is written in
        the nearest folder of `root` that exists, asked for by every rank, and removed."""
        if not self.sharded_checkpoints or not self.remote:
            return None
        where = next(p for p in (root, *root.parents) if p.is_dir())
        token = secrets.token_hex(8)
        probe = where / f".relay-storage-probe-{token}"
        try:
            probe.write_text(token)
        except OSError:
            return None  # not writable here: the run folder's own checks say so in their words
        try:
            blind = self._learner.blind_ranks(str(probe.resolve()), token)
        finally:
            probe.unlink(missing_ok=True)
        if not blind:
            return None
        return (
            f"checkpoint.format=sharded: learner {', '.join(blind)} cannot see {where}, where the run "
            "folder is: each rank writes its own shards there. Put the run folder on storage every "
            "learner node mounts (--run-dir), or set checkpoint.format=whole"
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("shards") is not None:  # the ranks read the model from its shards, not these shapes
            state = {k: v for k, v in state.items() if k != "model"}
        self._learner.load_state_dict(state)
        self._training = None  # the loop drained it before the restore
        self.completions = int(state.get("completions", 0))
        saved = state.get("reward_faults") or {}
        self.reward_faults = {k: int(saved.get(k, 0)) for k in REWARD_FAULT_KINDS}
        self.reward_scaling.load_state_dict(state.get("reward_scaling"))
        if self.generators:  # the restored weights are the generators' from now on
            self.version = int(state["version"])
            self._inflight = self._ready = None  # sampled with other weights: dropped
            self._accepts = []
            self._sync_weights()

    def restart_learner(self) -> None:
        self._learner.restart()
        self._inflight = self._ready = None  # its prompts were the lost learner's
        self._accepts = []
        self._training = None  # a call to the learner that died
        if self.generators:  # a fresh learner's weights, until a checkpoint is restored into it
            self.version = 0
            self._sync_weights()

    def evaluation_runner(self) -> EvalRunner:
        return LanguageEvalRunner(self)

    def reseed_workers(self, stream: int) -> None:
        pass  # reward functions draw no noise of relay's

    def close(self) -> None:
        if self.rewards is not None:
            self.rewards.close()
        for g in self.generators:
            ray.kill(g, no_restart=True)
        self.generators = []
        if self.learner is not None:
            self.learner.kill()
        self.learner = None


class LanguageEvalRunner:
    """Evaluations of a language run: the first eval.episodes prompts of prompts.eval, one
    completion each (greedy where eval.deterministic), scored by the run's rewards; an episode's
    return is its completion's reward. It runs between rounds, on the learner's device (which
    generation would occupy anyway), so `submit` finishes it and `poll` hands it over."""

    def __init__(self, backend: LanguageBackend) -> None:
        self.backend = backend
        self._done: tuple[EvalReport, Callable[[], dict[str, Any]]] | None = None

    def busy(self) -> bool:
        return False

    def submit(self, iteration: int, video: bool) -> None:
        b, ev = self.backend, self.backend.cfg.eval
        t0 = time.perf_counter()
        out = b._learner.evaluate(ev.episodes, ev.deterministic)
        rewards = b._score(out)[0].rewards
        scored = [r for r in rewards if r is not None]
        arr = np.asarray(scored if scored else [np.nan])
        summary = {
            "return_mean": float(arr.mean()),
            "return_std": float(arr.std()),
            "return_min": float(arr.min()),
            "return_max": float(arr.max()),
            "len_mean": float(np.mean(out["lengths"])),
            "episodes": len(scored),
            "seconds": time.perf_counter() - t0,
        }
        note = None if scored else "no eval completion got a reward (every reward faulted)"
        weights = b._learner.acting_weights()
        self._done = (EvalReport(iteration, int(out["version"]), summary, note=note), lambda: weights)

    def poll(self) -> tuple[EvalReport, Callable[[], dict[str, Any]]] | None:
        done, self._done = self._done, None
        return done

    def close(self) -> None:
        pass
