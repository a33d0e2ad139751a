#!/usr/bin/env python3
"""Scrapes a metrics endpoint with urllib and parses the exposition with
the Python prometheus_client's parser of the asked format; prints every
sample as JSON ([name, labels, value] rows). Used by tests/tests/metrics.rs.

    scrape.py URL openmetrics|text
"""
import json
import math
import sys
import urllib.request

url, fmt = sys.argv[1], sys.argv[2]
accept = {
    "openmetrics": "application/openmetrics-text;version=1.0.0,*/*;q=0.1",
    "text": "text/plain;version=0.0.4",
}[fmt]
with urllib.request.urlopen(urllib.request.Request(url, headers={"Accept": accept})) as r:
    content_type = r.headers["Content-Type"]
    text = r.read().decode("utf-8")
if fmt == "openmetrics":
    assert content_type.startswith("application/openmetrics-text"), content_type
    from prometheus_client.openmetrics.parser import text_string_to_metric_families
else:
    assert content_type.startswith("text/plain"), content_type
    from prometheus_client.parser import text_string_to_metric_families
rows = []
for family in text_string_to_metric_families(text):
    for s in family.samples:
        value = s.value if math.isfinite(s.value) else 1e308
        rows.append([s.name, s.labels, value])
json.dump(rows, sys.stdout)
