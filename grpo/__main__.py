import sys

from grpo.cli import main

# the guard: vLLM (rollout_engine=vllm) spawns its engine process, which imports this module again
if __name__ == "__main__":
    sys.exit(main())
