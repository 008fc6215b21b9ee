"""The bm25s side of scripts/bench-search: same corpus, same queries, same k, same measures."""
import json
import sys
import time

import bm25s
import Stemmer


def main(corpus_path, questions_path, k=10):
    titles, docs = [], []
    with open(corpus_path) as corpus:
        for line in corpus:
            row = json.loads(line)
            if "contents" in row:
                first, _, rest = row["contents"].partition("\n")
                title = first.strip().strip('"')
            else:
                title, rest = row["title"], row["text"]
            titles.append(title)
            docs.append(title + "\n" + rest)
    questions = [json.loads(line) for line in open(questions_path) if line.strip()]
    queries = [q["question"] for q in questions]
    stemmer = Stemmer.Stemmer("english")

    start = time.perf_counter()
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(docs, stopwords="en", stemmer=stemmer, show_progress=False), show_progress=False)
    build = time.perf_counter() - start

    latencies = []
    for query in queries:
        start = time.perf_counter()
        retriever.retrieve(bm25s.tokenize([query], stopwords="en", stemmer=stemmer, show_progress=False), k=k, show_progress=False)
        latencies.append((time.perf_counter() - start) * 1e3)
    latencies.sort()

    start = time.perf_counter()
    tokens = bm25s.tokenize(queries, stopwords="en", stemmer=stemmer, show_progress=False)
    results, _ = retriever.retrieve(tokens, k=k, n_threads=2, show_progress=False)
    batch = time.perf_counter() - start

    print(f"passages          {len(docs)}")
    print(f"index build       {build:.1f} s ({len(docs) / build:.0f} passages/s, in memory)")
    print(f"p50 latency       {latencies[len(latencies) // 2]:.3f} ms (one query at a time, k={k})")
    print(f"p99 latency       {latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]:.3f} ms")
    print(f"batch throughput  {len(queries) / batch:.0f} queries/s (one batch, n_threads=2)")
    if any(q.get("supporting_titles") for q in questions):
        for cut in (3, 10):
            total = 0.0
            for q, row in zip(questions, results):
                top = {titles[i] for i in row[:cut]}
                support = q.get("supporting_titles") or []
                total += sum(t in top for t in support) / max(1, len(support))
            print(f"recall@{cut:<2}         {total / len(questions):.4f} (supporting titles)")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
