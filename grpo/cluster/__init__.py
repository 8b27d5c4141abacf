"""``launcher=ray``: the same run placed on a Ray cluster.

The driver (``grpo train launcher=ray ...``, launch.py) joins or starts a cluster and places, each with
a placement group of its own: the trainer ranks (the trainer and its torch.distributed code, unchanged:
each rank is a Ray actor given torchrun's environment), the rollout workers (rollout.py: an engine
replica each, sampling whole groups from the trainer's keys, weights through Ray's object store) and
the reward workers (rewards.py: the run's rewards scored where they run, outcomes sent back to be
checked and counted by the trainer as it counts its own). A worker that dies is restarted by Ray and
its unfinished work is done again from the same inputs (rollouts: the same keys, so the same tokens);
a trainer rank that dies restarts the run from its last checkpoint (faults.py names the test hooks).
"""
