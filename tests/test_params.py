"""params.refuse_data_parallel finds every DDP wrapper (Note [Finding DDP wrappers] in
commsched/params.py): one made before commsched was imported, found by the heap scan, and one
made after, found by the module-registration hook, in a Gloo world of one. The wrapper made in
a job of several ranks is refused in tests/world/test_user_calls_dist.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.processes

SCRIPT = textwrap.dedent("""
    import json, sys
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
    before = nn.Linear(4, 2)
    kept_before = DistributedDataParallel(before)

    import commsched  # after the first wrapper: only the heap scan can find it

    def outcome(net):
        try:
            opt = commsched.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1),
                                                 named_parameters=net.named_parameters())
        except ValueError as err:
            return str(err)
        opt.session.close()
        return "accepted"

    class Subclassed(DistributedDataParallel):
        pass

    got = {"before": outcome(before)}  # the heap is scanned here, once
    after, plain = nn.Linear(4, 2), nn.Linear(4, 2)
    kept_after = Subclassed(after)  # only the hook can find this one
    got.update(after=outcome(after), plain=outcome(plain), after_again=outcome(after))
    print(json.dumps(got))
    commsched.shutdown()
    dist.destroy_process_group()
""")


def test_wrappers_made_before_and_after_the_import_are_refused(tmp_path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "store")], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["plain"] == "accepted", got
    for which in ("before", "after", "after_again"):
        assert "belong to a module wrapped in torch's DistributedDataParallel" in got[which], \
            (which, got[which])
