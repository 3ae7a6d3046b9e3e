#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The licence is where a newcomer and a scanner look for it: LICENSE (Apache-2.0, the licence of
# Apache Kafka), NOTICE, the OpenAPI file's info.license, and an SPDX line near the top of every
# source file the project tracks (C, headers, scripts, CMake, SQL, JavaScript, systemd units).
# Data files (JSON, test vectors, images) cannot hold a comment and are covered by LICENSE.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"

cd "$ONCEQ_SRC" || oq_fail "no source tree"
[[ -f LICENSE ]] || oq_fail "no LICENSE file"
grep -q "Apache License" LICENSE && grep -q "Version 2.0, January 2004" LICENSE ||
    oq_fail "LICENSE is not the Apache License 2.0"
[[ -f NOTICE ]] || oq_fail "no NOTICE file"
grep -q "onceq" NOTICE || oq_fail "NOTICE does not name the project"
python3 - <<'PY' || oq_fail "docs/openapi.yaml: info.license is not Apache-2.0"
import yaml, sys
d = yaml.safe_load(open("docs/openapi.yaml"))
lic = d.get("info", {}).get("license", {})
sys.exit(0 if lic.get("identifier") == "Apache-2.0" or lic.get("name") == "Apache-2.0" else 1)
PY

# Every tracked source file, or every file under the tree when this is not a git checkout.
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    list() { git ls-files; }
else
    list() { find . -type f -not -path './build*' -not -path './.git/*' | sed 's|^\./||'; }
fi
is_source() {
    case "$1" in
    *.c | *.h | *.sh | *.py | *.cmake | *.sql | *.mjs | *.js | *.ts | *.lua | *.service.in | \
        */CMakeLists.txt | CMakeLists.txt | Makefile | quickstart | .ci/run) return 0 ;;
    esac
    return 1
}
missing=0
checked=0
while IFS= read -r f; do
    is_source "$f" || continue
    [[ -f "$f" ]] || continue
    checked=$((checked + 1))
    if ! head -n 5 "$f" | grep -q 'SPDX-License-Identifier: Apache-2.0'; then
        echo "no SPDX line in the first 5 lines: $f" >&2
        missing=$((missing + 1))
    fi
done < <(list)
((checked > 100)) || oq_fail "only $checked source files found: the scan is not looking at the tree"
((missing == 0)) || oq_fail "$missing of $checked source files lack 'SPDX-License-Identifier: Apache-2.0'"
oq_pass "LICENSE, NOTICE, OpenAPI licence; SPDX in all $checked source files"
