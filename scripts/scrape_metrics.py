#!/usr/bin/env python3
# scripts/scrape_metrics.py HOST:PORT SECONDS: one process scraping http://ADDR/metrics every 100 ms over a kept-alive connection.
import http.client, sys, time
host, port = sys.argv[1].split(':')
ok = fail = 0
conn = None
end = time.time() + float(sys.argv[2])
while time.time() < end:
    try:
        if conn is None:
            conn = http.client.HTTPConnection(host, int(port), timeout=2)
        conn.request('GET', '/metrics')
        r = conn.getresponse(); r.read()
        ok += r.status == 200; fail += r.status != 200
    except Exception:
        fail += 1; conn = None
    time.sleep(0.1)
print(f'scrapes ok={ok} other={fail}', file=sys.stderr)
