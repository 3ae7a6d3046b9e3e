#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The production set-up of one onceq host, as README.md "Install and run as a service" quotes
# it: the onceq user, /etc/onceq (shared settings, the producer's, the tools file), the Kafka
# topics, then the units in their start order (producer, relay, consumers) and a readiness
# check. Run it as root after `cmake --install build --prefix PREFIX`:
#
#   sudo OQ_BROKERS=kafka1:9092,kafka2:9092,kafka3:9092 OQ_TOOLS=./tools.json \
#        scripts/production-setup.sh
#
# Settings (environment):
#   OQ_BROKERS         Kafka bootstrap list (required): every unit gets it, the producer too
#                      (it reads the results back)
#   OQ_PREFIX          the install prefix (default /usr/local)
#   OQ_TOOLS           the HTTP tools file to install as /etc/onceq/tools.json (default: none,
#                      an empty list: the compiled tools only)
#   OQ_CONSUMERS       consumer workers on this host (default 2)
#   OQ_LISTEN          the producer's HTTP address (default 127.0.0.1:8081)
#   OQ_TOPIC_PREFIX    topic names' prefix (default onceq.)
#   OQ_PARTITIONS      partitions of each topic (default 6: at least the consumers you will run)
#   OQ_REPLICATION     replication factor (default 3; min.insync.replicas is 2, or 1 with RF 1)
#   OQ_CREATE_TOPICS   yes (default) or no (the topics exist: the embedded broker makes its own)
#   OQ_ETC             the settings folder (default /etc/onceq: the units read that path)
#   SYSTEMCTL, SYSUSERS  the commands (default systemctl, systemd-sysusers)
# Idempotent: a second run rewrites the files and leaves existing topics alone.
# Exit: 0 when every unit started and the producer answers /readyz; 1 otherwise.
set -euo pipefail

: "${OQ_BROKERS:?set OQ_BROKERS to the Kafka bootstrap list, e.g. kafka1:9092,kafka2:9092}"
OQ_PREFIX=${OQ_PREFIX:-/usr/local}
OQ_TOOLS=${OQ_TOOLS:-}
OQ_CONSUMERS=${OQ_CONSUMERS:-2}
OQ_LISTEN=${OQ_LISTEN:-127.0.0.1:8081}
OQ_TOPIC_PREFIX=${OQ_TOPIC_PREFIX:-onceq.}
OQ_PARTITIONS=${OQ_PARTITIONS:-6}
OQ_REPLICATION=${OQ_REPLICATION:-3}
OQ_CREATE_TOPICS=${OQ_CREATE_TOPICS:-yes}
OQ_ETC=${OQ_ETC:-/etc/onceq}
SYSTEMCTL=${SYSTEMCTL:-systemctl}
SYSUSERS=${SYSUSERS:-systemd-sysusers}
ONCEQ=$OQ_PREFIX/bin/onceq
UNITS=$OQ_PREFIX/lib/systemd/system
say() { echo "==> $*"; }

# --- guide begin (README.md quotes this part verbatim) ---
# 1. The onceq user, owner of /var/lib/onceq (the units' StateDirectory).
$SYSUSERS "$OQ_PREFIX/lib/sysusers.d/onceq.conf"

# 2. Settings, root-only: systemd reads them as root and hands them to the units.
#    onceq.env is read by every unit, so the producer gets the brokers too (without them
#    it never reads the results and calls stay pending); the tools file may hold secrets
#    and reaches the consumers as a credential (LoadCredential=, ONCEQ_TOOLS=%d/tools.json).
umask 077
mkdir -p "$OQ_ETC"
printf 'ONCEQ_BROKERS=%s\nONCEQ_TOPIC_PREFIX=%s\n' "$OQ_BROKERS" "$OQ_TOPIC_PREFIX" \
    >"$OQ_ETC/onceq.env"
printf 'ONCEQ_LISTEN=%s\n' "$OQ_LISTEN" >"$OQ_ETC/onceq-producer.env"
if [ -n "$OQ_TOOLS" ]; then
    install -m 0600 "$OQ_TOOLS" "$OQ_ETC/tools.json"
elif [ ! -f "$OQ_ETC/tools.json" ]; then
    echo '{"version": 1, "tools": []}' >"$OQ_ETC/tools.json"
fi

# 3. The topics (RF 3, min.insync.replicas 2; keep auto.create.topics.enable=false).
if [ "$OQ_CREATE_TOPICS" = yes ]; then
    isr=$((OQ_REPLICATION > 1 ? 2 : 1))
    "$ONCEQ" topics create --brokers "$OQ_BROKERS" --topic-prefix "$OQ_TOPIC_PREFIX" \
        --partitions "$OQ_PARTITIONS" --replication-factor "$OQ_REPLICATION" \
        --min-insync-replicas "$isr" --if-not-exists
fi

# 4. The units, in their start order: the producer (API, results), the relay (outbox ->
#    Kafka), the consumers. Type=notify: each start returns once the process said READY=1.
#    Units outside systemd's search path (a prefix other than /usr or /usr/local) are linked.
case "$OQ_PREFIX" in
/usr | /usr/local) ;;
*) $SYSTEMCTL link "$UNITS/onceq-producer.service" "$UNITS/onceq-relay.service" \
    "$UNITS/onceq-consumer@.service" ;;
esac
$SYSTEMCTL daemon-reload
$SYSTEMCTL enable --now onceq-producer.service
$SYSTEMCTL enable --now onceq-relay.service
for i in $(seq 1 "$OQ_CONSUMERS"); do
    $SYSTEMCTL enable --now "onceq-consumer@$i.service"
done

# 5. Ready: the producer's database takes writes and a broker answers.
for _ in $(seq 1 60); do
    curl -sf "http://$OQ_LISTEN/readyz" >/dev/null && break
    sleep 1
done
curl -sf "http://$OQ_LISTEN/readyz"
echo
# --- guide end ---
say "onceq runs: submit with onceq call --url http://$OQ_LISTEN --key K --tool T --args '{...}'"
