#!/usr/bin/env python3
"""Embedding throughput of Python sentence-transformers on all-MiniLM-L6-v2, beside
`sesa bench-skills` (same model files from the sesa model cache, same texts, same batch size).

Usage: python3 benches/embed_st.py hotpotqa/questions.jsonl [limit]
Needs `pip install sentence-transformers` (and torch); the model comes from
`sesa model fetch all-minilm-l6-v2` (~/.cache/sesa/models/all-minilm-l6-v2).
"""
import json
import os
import sys
import time

try:
    import torch
    from sentence_transformers import SentenceTransformer
except ImportError as missing:
    raise SystemExit(f"{missing}: this script needs `pip install sentence-transformers`")

path = sys.argv[1]
limit = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
texts = [json.loads(line)["question"] for line in open(path) if line.strip()][:limit]
home = os.environ.get("SESA_HOME", os.path.expanduser("~/.cache/sesa"))
model = SentenceTransformer(os.path.join(home, "models", "all-minilm-l6-v2"), device="cpu")
print(f"torch threads     {torch.get_num_threads()}")
model.encode(texts[:32], batch_size=32)  # warm up
start = time.perf_counter()
model.encode(texts, batch_size=32, normalize_embeddings=True)
seconds = time.perf_counter() - start
print(f"texts             {len(texts)} (batches of 32)")
print(f"embedding         {len(texts) / seconds:.1f} texts/s ({seconds:.2f} s)")
single = []
for text in texts[:100]:
    start = time.perf_counter()
    model.encode([text])
    single.append((time.perf_counter() - start) * 1e3)
single.sort()
print(f"one query         p50 {single[len(single) // 2]:.2f} ms")
