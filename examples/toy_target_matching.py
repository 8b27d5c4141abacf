"""Target matching with a Bernoulli table: REINFORCE vs mean baseline vs GRPO (same as `grpo toy`).

Run: python examples/toy_target_matching.py [--seeds 5]
The implementation lives in grpo/toy.py so the installed `grpo toy` command can run it too.
"""

from grpo.tools.toy import main

if __name__ == "__main__":
    main()
