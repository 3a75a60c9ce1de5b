#!/bin/bash
# scripts/bench_metrics_overhead.sh: the A/B of docs/observability.md ("Overhead of the endpoint").
# kv_bench vllm_write,vllm_get, perf points on; a Python process "scrapes" every 100 ms in both
# modes: in `plain` a port nobody serves (the DB has no endpoint), in `scraped` the DB's own
# /metrics.  Same machine, modes alternated.
cd "$(dirname "$0")/.."
PORT=19470
ARGS="--benchmarks=vllm_write,vllm_get --value_size=262144 --num_layers=32 --duration=3 --memory=1GiB"
for r in 1 2 3 4; do
  for mode in plain scraped; do
    opts="perf_level=all"
    target=127.0.0.1:9
    if [ $mode = scraped ]; then opts="$opts,metrics_listen=127.0.0.1:$PORT"; target=127.0.0.1:$PORT; fi
    python3 scripts/scrape_metrics.py $target 40 2>/dev/null &
    SCRAPER=$!
    out=$(build/kv_bench $ARGS --options=$opts 2>&1 | grep -E "^vllm_(write|get) ")
    kill $SCRAPER; wait $SCRAPER 2>/dev/null
    echo "$out" | sed "s/^/$r $mode /"
  done
done
