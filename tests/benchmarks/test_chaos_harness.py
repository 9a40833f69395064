"""The chaos run's pure parts (benchmarks/harness/chaos.py): the trials it draws and the
verdict it gives a trial's folder."""

from __future__ import annotations

import json
import os

import torch

from benchmarks.harness import chaos, chaos_job


def test_trials_cover_every_policy_point_and_launcher() -> None:
    trials = chaos.draw_trials(20, seed=0)
    assert trials == chaos.draw_trials(20, seed=0)  # the seed fixes the run
    for launcher in ("elastic", "torchrun"):  # every policy under each launcher
        assert {t["policy"] for t in trials if t["launcher"] == launcher} \
            >= set(chaos.POLICIES), launcher
    # The compressors and K-FAC lose a worker under elastic Horovod only: torchrun resumes
    # them from a checkpoint, which the tests marked launcher cover.
    assert {t["policy"] for t in trials if "+" in t["policy"]} == set(chaos.MODES)
    assert all(t["launcher"] == "elastic" for t in trials if "+" in t["policy"])
    assert {t["kill"]["point"] for t in trials} == set(chaos.POINTS)
    assert {t["launcher"] for t in trials} == {"elastic", "torchrun"}
    for t in trials:
        assert 0 <= t["kill"]["rank"] < t["world"]
        assert 2 <= t["kill"]["step"] < chaos_job.STEPS - 1
        if t["kill"]["point"] == "save" and t["launcher"] == "torchrun":  # a step that saves
            assert (t["kill"]["step"] + 1) % chaos_job.SAVE_EVERY == 0, t
    must_fail = [t for t in trials if t["restarts"] == 0]
    assert must_fail and all(t["launcher"] == "torchrun" for t in must_fail)


def _folder(tmp_path, trial: dict, lines: list[dict], final: list[torch.Tensor] | None) -> str:
    directory = str(tmp_path)
    with open(os.path.join(directory, "killed"), "w", encoding="utf-8") as handle:
        json.dump({"rank": 1, "step": 4, "point": "forward", "time": 100.0}, handle)
    with open(os.path.join(directory, "log.a.jsonl"), "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(line) + "\n" for line in lines)
    if final is not None:
        torch.save({"params": final, "size": 2}, os.path.join(directory, "final.pt"))
    return directory


def test_a_resumed_trial_is_checked_against_the_replay_of_its_history(tmp_path) -> None:
    trial = {"index": 0, "launcher": "elastic", "world": 3, "policy": "dear", "restarts": 1,
             "kill": {"rank": 1, "step": 4, "point": "forward"}}
    # Steps 0-3 on 3 ranks, step 4 failed, then 4-11 on 2 (step 3 ran again after a restore).
    lines = [{"event": "step", "step": s, "size": 3, "time": s} for s in range(4)]
    lines += [{"event": "error", "step": 4, "error": "ElasticRankFailureError", "time": 4.5},
              {"event": "step", "step": 3, "size": 2, "time": 5}]
    lines += [{"event": "step", "step": s, "size": 2, "time": 6 + s} for s in range(4, 12)]
    history = [(s, 3) for s in range(3)] + [(s, 2) for s in range(3, 12)]
    right = chaos_job.reference(history)
    ok = chaos.verdict(trial, _folder(tmp_path, trial, lines, right), "", 0, False, 90.0, 130.0)
    assert ok["ok"] and ok["outcome"] == "resumed" and ok["max_diff"] == 0.0
    assert ok["errors"] == ["ElasticRankFailureError"]
    # A step applied with the wrong world size shows in the parameters.
    wrong = chaos_job.reference([(s, 3) for s in range(12)])
    bad = chaos.verdict(trial, _folder(tmp_path, trial, lines, wrong), "", 0, False, 90.0, 130.0)
    assert not bad["ok"] and bad["max_diff"] > 1e-4


def test_a_compressed_trial_is_replayed_with_its_compressors_reset_at_each_bind(
        tmp_path) -> None:
    # Note [Elastic Horovod and compressor state]: steps 0-3 on 3 ranks, 4-11 on 2 after a
    # re-form (rank 0's optimizer bound a second time), PowerSGD's state afresh from step 4.
    trial = {"index": 0, "launcher": "elastic", "world": 3, "policy": "dear+powersgd",
             "restarts": 1, "kill": {"rank": 1, "step": 4, "point": "forward"}}
    lines = [{"event": "step", "step": s, "size": 3 if s < 4 else 2, "rank": 0,
              "binds": 1 if s < 4 else 2, "time": s} for s in range(12)]
    history = [(s, 3 if s < 4 else 2) for s in range(12)]
    binds = [1 if s < 4 else 2 for s in range(12)]
    right = chaos_job.reference(history, "dear+powersgd", binds)
    ok = chaos.verdict(trial, _folder(tmp_path, trial, lines, right), "", 0, False, 90.0, 130.0)
    assert ok["ok"] and ok["max_diff"] == 0.0
    # A reset where the job made none, or no compression at all, shows in the parameters.
    for wrong in (chaos_job.reference(history, "dear+powersgd", binds[:6] + [3] * 6),
                  chaos_job.reference(history, "dear")):
        bad = chaos.verdict(trial, _folder(tmp_path, trial, lines, wrong), "", 0, False, 90.0,
                            130.0)
        assert not bad["ok"] and bad["max_diff"] > 1e-4


def test_a_trial_with_no_restart_must_name_the_culprit_in_time(tmp_path) -> None:
    trial = {"index": 9, "launcher": "torchrun", "world": 2, "policy": "horovod", "restarts": 0,
             "kill": {"rank": 1, "step": 4, "point": "forward"}}
    directory = _folder(tmp_path, trial, [], None)
    named = "torch.distributed.elastic... Failures: rank: 1 (local_rank: 1) exitcode: -9"
    assert chaos.verdict(trial, directory, named, 1, False, 90.0, 110.0)["ok"]
    late = chaos.verdict(trial, directory, named, 1, False, 90.0, 100.0 + 31.0)
    assert not late["ok"]
    assert not chaos.verdict(trial, directory, "it failed", 1, False, 90.0, 110.0)["ok"]
    assert chaos.verdict(trial, directory, named, None, True, 90.0, 400.0)["outcome"] == "hung"
