#!/usr/bin/env bash
# Copies the generated CRDs (deploy/crds/, written by `python -m api.crd`) into the chart, which
# renders them from its files/ directory. tests/deploy/test_chart.py fails while the copies differ.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cp "$here/../crds/"*.yaml "$here/sharegpu/files/"
echo "copied $(ls "$here/../crds/"*.yaml | wc -l) CRD file(s) into $here/sharegpu/files/"
