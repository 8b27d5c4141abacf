"""A real engine for ``grpo vllm-serve``'s HTTP front where vLLM is not installed: a tiny transformers
model that samples (seeded per row, log-probs after temperature), scores tokens and loads safetensors
weights in place, as the vLLM engine does. The server, its flags, checks and signals are
``grpo.rollout.vllm.server``'s own; only the engine behind them differs.

``python -m tests.vllm_standin MODEL_FOLDER [grpo vllm-serve flags]`` runs the command on it."""

from __future__ import annotations

import sys

import torch

from grpo.rollout.vllm.rows import SampledRows


class StandInEngine:
    def __init__(self, folder: str):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        self.vocab_size = int(self.model.config.vocab_size)
        self.loads = 0

    @classmethod
    def from_args(cls, args) -> "StandInEngine":
        return cls(args.model)

    @torch.no_grad()
    def _row(self, prompt: list[int], p: dict) -> tuple[list[int], list[float]]:
        gen = torch.Generator().manual_seed(p["seed"]) if p.get("seed") is not None else None
        ids, toks, logps = torch.tensor([prompt]), [], []
        stop = set(p.get("stop_token_ids") or []) if not p.get("ignore_eos") else set()
        for _ in range(p["max_tokens"]):
            logits = self.model(input_ids=ids).logits[0, -1].float()  # [V]
            t = p.get("temperature", 1.0)
            if t == 0:
                tok = int(logits.argmax())
                logp = torch.log_softmax(logits, -1)
            else:
                logp = torch.log_softmax(logits / t, -1)  # [V]
                k = p.get("top_k", -1)
                if k > 0:
                    logp = logp.masked_fill(logp < logp.topk(k).values[-1], float("-inf"))
                tok = int(torch.multinomial(logp.exp(), 1, generator=gen))
            toks.append(tok)
            logps.append(float(logp[tok]))
            ids = torch.cat([ids, torch.tensor([[tok]])], 1)
            if tok in stop:
                break
        return toks, logps

    def sample(self, prompts, params) -> SampledRows:
        rows = [self._row(pr, pa) for pr, pa in zip(prompts, params)]
        with_logprobs = bool(params) and params[0].get("logprobs") is not None
        return SampledRows([r[0] for r in rows], [r[1] for r in rows] if with_logprobs else None)

    @torch.no_grad()
    def score(self, rows):
        out = []
        for r in rows:
            logp = torch.log_softmax(self.model(input_ids=torch.tensor([r])).logits[0, :-1].float(), -1)  # [T-1, V]
            out.append(logp.gather(1, torch.tensor(r[1:])[:, None])[:, 0].tolist())
        return out

    def load_weights(self, path: str) -> int:
        from safetensors.torch import load_file

        weights = load_file(path)
        self.model.load_state_dict(weights, strict=False)
        self.model.tie_weights()
        self.loads += 1
        return len(weights)

    def close(self) -> None:
        pass


if __name__ == "__main__":
    from grpo.rollout.vllm.server import vllm_serve_main

    torch.set_num_threads(1)  # a tiny model: more threads only contend with the trainer beside it
    sys.exit(vllm_serve_main(sys.argv[1:], make_engine=StandInEngine.from_args))
