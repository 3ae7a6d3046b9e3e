#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Fetch the Apache Kafka broker jars declared in kafka/pom.xml into a cache folder outside the
# source tree, with Maven. Idempotent: a complete cache (marked by its .complete stamp, which
# records the pom's checksum) is left alone; a partial one is rebuilt. Jars are copied into a
# temporary folder first and renamed into place, so an interrupted fetch leaves no half cache.
#
#   scripts/kafka-fetch.sh            fetch if needed; prints the cache folder on the last line
#   scripts/kafka-fetch.sh --print    print the cache folder (fetched or not) and exit
#   scripts/kafka-fetch.sh --check    exit 0 when the cache is complete, 1 otherwise
#
# Environment:
#   ONCEQ_KAFKA_CACHE   cache folder (default ~/.cache/onceq/kafka-<version>); the jars go to
#                       its libs/ subfolder
#   MVN                 the Maven command (default mvn)
# Needs Java 17+ to run the broker afterwards, and Maven 3 to fetch. Progress goes to stderr.
set -euo pipefail

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
pom=$src/kafka/pom.xml
version=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$pom" | head -n1)
[[ -n "$version" ]] || { echo "kafka-fetch: no <kafka.version> in $pom" >&2; exit 2; }
cache=${ONCEQ_KAFKA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/onceq/kafka-$version}
[[ "$cache" == /* ]] || cache=$PWD/$cache
sum=$(sha256sum "$pom" | cut -d' ' -f1)

say() { echo "kafka-fetch: $*" >&2; }

complete() {
    [[ -f "$cache/.complete" && "$(cat "$cache/.complete")" == "$sum" ]] &&
        compgen -G "$cache/libs/kafka_2.13-$version.jar" >/dev/null
}

case "${1:-}" in
--print) echo "$cache"; exit 0 ;;
--check) complete; exit $? ;;
"") ;;
*) echo "usage: scripts/kafka-fetch.sh [--print|--check]" >&2; exit 2 ;;
esac

case "$cache" in
"$src" | "$src"/*) say "refusing a cache inside the source tree: $cache"; exit 2 ;;
esac

if complete; then
    say "Kafka $version already in $cache/libs ($(find "$cache/libs" -name '*.jar' | wc -l) jars)"
    echo "$cache"
    exit 0
fi

command -v "${MVN:-mvn}" >/dev/null || { say "Maven (mvn) is not installed"; exit 1; }
command -v java >/dev/null || say "note: java is not installed; the broker will not run"

mkdir -p "$cache"
tmp=$(mktemp -d "$cache/.libs.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
say "fetching Kafka $version and its runtime dependencies with Maven (about 45 MB) into $cache/libs"
# -q: only errors; the local Maven repository (~/.m2) keeps the downloads for the next fetch.
rc=0
"${MVN:-mvn}" -B -q -f "$pom" dependency:copy-dependencies -DincludeScope=runtime \
    -DoutputDirectory="$tmp" 2>&1 | sed -e 's/\x1b\[[0-9;]*m//g' -e '/^$/d' >&2 || rc=${PIPESTATUS[0]}
[[ $rc == 0 ]] || { say "Maven failed (exit $rc)"; exit 1; }
[[ -f "$tmp/kafka_2.13-$version.jar" ]] || { say "Maven did not deliver kafka_2.13-$version.jar"; exit 1; }
rm -rf "$cache/libs" "$cache/.complete"
mv "$tmp" "$cache/libs"
trap - EXIT
echo "$sum" >"$cache/.complete.tmp" && mv "$cache/.complete.tmp" "$cache/.complete"
say "done: $(find "$cache/libs" -name '*.jar' | wc -l) jars in $cache/libs"
echo "$cache"
