"""Lints IAM policy files with parliament's own auditors and its community
auditors; prints one JSON object per finding on stdout and exits 1 when
there is any. Uses parliament's library API: its command line refuses to
read a file when standard input is not a terminal."""

import json
import sys

import parliament
from parliament import analyze_policy_string, enhance_finding


def main(paths):
    findings = 0
    for path in paths:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        policy = analyze_policy_string(text, filepath=path, include_community_auditors=True)
        for finding in policy.findings:
            finding = enhance_finding(finding)
            findings += 1
            print(json.dumps({
                "file": path,
                "issue": finding.issue,
                "severity": finding.severity,
                "title": finding.title,
                "detail": str(finding.detail),
                "location": str(finding.location),
            }))
    print(f"parliament {parliament.__version__}: {findings} finding(s) in {len(paths)} file(s)", file=sys.stderr)
    return 1 if findings else 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: lint.py POLICY.json...")
    sys.exit(main(sys.argv[1:]))
