#!/usr/bin/env python3
"""Helpers of the dashboard script tests (browser_dashboard.sh, dashboard_cli.sh), standard library only.

  dashboard_check.py free-port
      prints a loopback port nothing listens on
  dashboard_check.py metric URL FAMILY
      prints the value of FAMILY's first sample at URL/metrics (exit 1 when unreachable or missing)
  dashboard_check.py points URL NAME
      prints the number of points of series NAME at URL/api/series (0 when absent)
  dashboard_check.py dom FILE JSONL [--restarts N] [--min-polls N]
      checks a page dumped by `chromium --dump-dom`: every plot has drawn points (data-state "drawn", data-points > 0),
      except an optional plot marked "absent" whose metrics JSONL does not log; the restart table counts N; prints
      "<plot>=<points> ..." and the page's last step
"""
import json
import re
import socket
import sys
import urllib.request

# The optional plots and the JSONL keys whose absence lets them be absent.
OPTIONAL = {"mfu": re.compile(r'"mfu"'), "layer_grad_norm": re.compile(r'"layer/[0-9]+/grad_norm"'),
            "expert_load": re.compile(r'"moe/load/l[0-9]+"')}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metric(url, family):
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(family + "{") or line.startswith(family + " "):
                return float(line.rsplit(" ", 1)[1])
    raise SystemExit(1)


def points(url, name):
    with urllib.request.urlopen(f"{url}/api/series?names={name}", timeout=5) as r:
        return len(json.load(r)["series"].get(name, {"steps": []})["steps"])


def attributes(tag):
    return dict(re.findall(r'([a-z-]+)="([^"]*)"', tag))


def dom(path, jsonl, restarts=None, min_polls=1):
    page = open(path, encoding="utf-8").read()
    logged = open(jsonl, encoding="utf-8").read()
    figures = [attributes(t) for t in re.findall(r"<figure[^>]*>", page)]
    body = attributes(re.search(r"<body[^>]*>", page).group(0))
    errors = []
    if not figures:
        errors.append("no plots in the page")
    for f in figures:
        name, state, points = f.get("data-plot"), f.get("data-state"), int(f.get("data-points", "0"))
        if state == "absent" and name in OPTIONAL and not OPTIONAL[name].search(logged):
            continue
        if state != "drawn" or points <= 0:
            errors.append(f"plot {name} is {state} with {points} points")
    if int(body.get("data-polls", "0")) < min_polls:
        errors.append(f"the page polled {body.get('data-polls')} times, expected at least {min_polls}")
    if restarts is not None:
        section = attributes(re.search(r'<section id="restarts"[^>]*>', page).group(0))
        if int(section.get("data-count", "-1")) != restarts:
            errors.append(f"restarts shows {section.get('data-count')}, expected {restarts}")
        rows = len(re.findall(r"<tr><td>", page))
        if rows != restarts:
            errors.append(f"the restart table has {rows} rows, expected {restarts}")
    print(" ".join(f"{f.get('data-plot')}={f.get('data-points')}" for f in figures), "last_step=" +
          body.get("data-last-step", "?"), "polls=" + body.get("data-polls", "?"))
    if errors:
        print("\n".join(errors), file=sys.stderr)
        raise SystemExit(1)


def main(argv):
    if argv[0] == "free-port":
        print(free_port())
    elif argv[0] == "metric":
        print(metric(argv[1], argv[2]))
    elif argv[0] == "points":
        print(points(argv[1], argv[2]))
    elif argv[0] == "dom":
        opts = dict(zip(argv[3::2], argv[4::2]))
        dom(argv[1], argv[2], int(opts["--restarts"]) if "--restarts" in opts else None,
            int(opts.get("--min-polls", "1")))
    else:
        raise SystemExit(f"unknown command {argv[0]}")


if __name__ == "__main__":
    main(sys.argv[1:])
