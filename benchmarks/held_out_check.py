"""A shipped decoder checked as a user would, outside autoprec: per-token speed and fresh-token loss.

    python benchmarks/held_out_check.py GIVEN.onnx SHIPPED.onnx [--past 40] [--rounds 12]

Per token: one decode token after a past of ``--past`` (batch 1), plain ONNX Runtime CPU sessions with one intra-op
thread, ``--rounds`` interleaved rounds of 20 runs each (the order alternating), timed by ``time.perf_counter``:
the median of the rounds' ratios and their range. Fresh tokens: 64 random prompts of 1 and of 7 tokens with no past,
each token's logits against the given model's (1 - cosine, mean, p90 and max; top-1 agreement). Nothing here is
autoprec's: not its sessions, clock, data or judge.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnxruntime as ort


def session(path: str, threads: int = 1) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def feeds(model: ort.InferenceSession, ids: np.ndarray, past: int, rng: np.random.Generator) -> dict:
    """``ids`` after a past of ``past`` random cache values (timing) or none (``past`` 0)."""
    rows, tokens = ids.shape
    found = {}
    for spec in model.get_inputs():
        if spec.name == "input_ids":
            found[spec.name] = ids
        elif spec.name == "attention_mask":
            found[spec.name] = np.ones((rows, past + tokens), np.int64)
        elif spec.name == "position_ids":
            found[spec.name] = np.tile(np.arange(past, past + tokens), (rows, 1))
        else:  # past_key_values.N.key/value: [batch, heads, past, head size]
            shape = [rows if i == 0 else d if isinstance(d, int) else past for i, d in enumerate(spec.shape)]
            found[spec.name] = rng.normal(size=shape).astype(np.float32)
    return found


def per_token(given: str, shipped: str, past: int, rounds: int) -> str:
    models = [session(given), session(shipped)]
    rng = np.random.default_rng(0)
    fed = [feeds(m, np.array([[5]]), past, rng) for m in models]
    for model, inputs in zip(models, fed):
        for _ in range(5):
            model.run(None, inputs)
    ratios, medians = [], [[], []]
    for r in range(rounds):
        now = [0.0, 0.0]
        for i in ([0, 1] if r % 2 == 0 else [1, 0]):
            times = []
            for _ in range(20):
                start = time.perf_counter()
                models[i].run(None, fed[i])
                times.append(time.perf_counter() - start)
            now[i] = float(np.median(times))
            medians[i].append(now[i])
        ratios.append(now[0] / now[1])
    return (f"per token (past {past}, batch 1, 1 thread): given {1e3 * np.median(medians[0]):.2f} ms, shipped "
            f"{1e3 * np.median(medians[1]):.2f} ms, {np.median(ratios):.2f}x (rounds {min(ratios):.2f}-{max(ratios):.2f})")


def fresh_tokens(given: str, shipped: str) -> list[str]:
    models = [session(given, 0), session(shipped, 0)]
    vocab = models[0].get_outputs()[0].shape[-1]
    rng = np.random.default_rng(7)
    lines = []
    for tokens in (1, 7):
        ids = rng.integers(0, vocab, (64, tokens))
        ref, got = (m.run(["logits"], feeds(m, ids, 0, rng))[0].reshape(-1, vocab).astype(np.float64) for m in models)
        loss = 1 - (ref * got).sum(1) / np.linalg.norm(ref, axis=1) / np.linalg.norm(got, axis=1)
        lines.append(f"fresh prompts of {tokens} token(s), 64: 1 - cos mean {loss.mean():.4g}, p90 "
                     f"{np.quantile(loss, 0.9):.4g}, max {loss.max():.4g}; top-1 same "
                     f"{np.mean(ref.argmax(1) == got.argmax(1)):.0%}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("given")
    parser.add_argument("shipped")
    parser.add_argument("--past", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args(argv)
    print(per_token(args.given, args.shipped, args.past, args.rounds))
    print("\n".join(fresh_tokens(args.given, args.shipped)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
