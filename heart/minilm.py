"""all-MiniLM-L6-v2 sentence embeddings with plain transformers.

The model folder is a sentence-transformers one (``modules.json``: Transformer with
``max_seq_length`` 256, mean pooling over real tokens, L2 normalisation). This computes the
same vectors as ``SentenceTransformer(path).encode(..., normalize_embeddings=True)``
(``tests/unit/test_minilm.py`` compares them) without importing sentence-transformers:
on this 2-core machine that import alone took ~5 s, paid by every process that embeds
anything on a cold cache (each collection, the end-to-end evaluation). Texts are encoded in
length-sorted batches, as sentence-transformers does, so short queries are not padded to
long ones.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


class MiniLM:
    """Mean-pooled, normalised embeddings of a sentence-transformers BERT folder."""

    def __init__(self, path: Path | str):
        import torch
        from transformers import AutoModel, AutoTokenizer

        path = Path(path)
        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        self.model = AutoModel.from_pretrained(str(path)).eval()
        config = path / "sentence_bert_config.json"
        self.max_seq_length = json.loads(config.read_text())["max_seq_length"] if config.exists() else 256

    def encode(self, texts: list[str], batch_size: int = 64, show_progress_bar: bool = False,
               **_: object) -> np.ndarray:
        """Unit vectors, one row per text, in the order given (float32)."""
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        vectors = np.zeros((len(texts), self.model.config.hidden_size), dtype=np.float32)
        starts = range(0, len(texts), batch_size)
        if show_progress_bar:
            from tqdm import tqdm

            starts = tqdm(starts, desc="embed", unit="batch")
        for start in starts:
            rows = order[start:start + batch_size]
            batch = self.tokenizer([texts[i] for i in rows], padding=True, truncation=True,
                                   max_length=self.max_seq_length, return_tensors="pt")
            with self.torch.inference_mode():
                hidden = self.model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            vectors[rows] = self.torch.nn.functional.normalize(pooled, p=2, dim=1).numpy()
        return vectors
