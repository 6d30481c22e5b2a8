"""First read of a journal source: journalctl's own time and the daemon's
whole first read, with every field and with --output-fields (run as root
in the systemd guest, after entries were written)."""
import json
import subprocess
import sys
import time

sys.path.insert(0, "/work/main")  # the project root
from pipexctl.discovery import discovery as d
from pipexctl.discovery.logparse import LineParser

FIELDS = "--output-fields=MESSAGE,_PID,_COMM,_EXE,SYSLOG_IDENTIFIER,SYSLOG_PID"
out = {}
for name, extra in (("all", []), ("fields", [FIELDS])) * 3:
    t = time.monotonic()
    p = subprocess.run(["journalctl", "-o", "json", "--no-pager", "-b", "-t", "xl2tpd", *extra], capture_output=True)
    dt = time.monotonic() - t
    out.setdefault(name + "_journalctl_s", []).append(round(dt, 2))
    out[name + "_bytes"] = len(p.stdout)
    out[name + "_entries"] = p.stdout.count(b"\n")
for name in ("all", "fields", "all", "fields"):
    # the daemon's own Journal: every field, or only those it reads
    d.OUTPUT_FIELDS = FIELDS if name == "fields" else "--no-pager"
    j = d.Journal("journal-id:xl2tpd", follow=False)
    lp = LineParser(journal=True)
    t = time.monotonic()
    n = recs = 0
    while True:
        lines = j.read_lines()
        n += len(lines)
        recs += sum(len(lp.feed(x)) for x in lines)
        if not j.more and j._journalctl is None:
            break
    out.setdefault(name + "_first_read_s", []).append(round(time.monotonic() - t, 2))
    out[name + "_records"] = recs
    j.close()
print(json.dumps(out, indent=1))
