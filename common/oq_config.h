/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file oq_config.h
 * @brief Settings: one table (name, type, default, bounds, doc) per command drives --help,
 *        argument parsing, the config file and validation. Unknown settings are errors.
 *
 * Command lines accept `--name value`, `--name=value`, boolean `--name` / `--no-name`,
 * `-X kafka.property=value` (repeatable; passed to librdkafka, which validates the name), and
 * `-F file` / `--config file`: lines `name = value` (onceq settings) or
 * `kafka.<property> = value`; `#` starts a comment. With oq_config_use_env(), every setting is
 * also read from the environment as <prefix><NAME> (upper case, '-' -> '_': ONCEQ_KEY_TTL).
 * Precedence: flag > environment > file > default, whatever the order on the command line
 * (among files, and among flags, the later one wins). Positional arguments are collected in
 * order.
 */
#ifndef OQ_CONFIG_H
#define OQ_CONFIG_H

#include <stdint.h>
#include <stdio.h>

#include "oq_error.h"

typedef enum {
    OQ_SET_BOOL,     /**< true/false/1/0/yes/no/on/off */
    OQ_SET_INT,      /**< decimal integer within [min,max] */
    OQ_SET_DURATION, /**< "250ms", "30s", "24h"; stored as ms within [min,max] */
    OQ_SET_SIZE,     /**< "1MiB", "64k"; stored as bytes within [min,max] */
    OQ_SET_STRING,   /**< any string; min/max bound its length when max > 0 */
    OQ_SET_ENUM      /**< one of the '|'-separated words in `choices` */
} oq_setting_type_t;

typedef struct oq_setting {
    const char *name; /**< long option name without dashes, e.g. "db" */
    oq_setting_type_t type;
    const char *def;     /**< default as text (NULL: unset/required-if-used) */
    int64_t min, max;    /**< bounds (ints/durations/sizes); ignored when min > max */
    const char *choices; /**< OQ_SET_ENUM: "full|normal|off" */
    const char *doc;     /**< one line for --help */
} oq_setting_t;

typedef struct oq_config oq_config_t;

/** @brief New config holding the defaults of \p table (\p n entries; the table is borrowed). */
oq_config_t *oq_config_new(const oq_setting_t *table, size_t n);
void oq_config_destroy(oq_config_t *c);

/**
 * @brief Read settings from the environment too, as \p prefix + the setting's name in upper
 *        case with '-' -> '_' ("ONCEQ_" + "key-ttl" -> ONCEQ_KEY_TTL), when parse_args runs.
 *        Only names of this table are looked up. NULL or "" turns it off (the default).
 */
void oq_config_use_env(oq_config_t *c, const char *prefix);

/** @brief Write the environment variable name of \p setting into \p out (OQ_EINVAL if short). */
int oq_config_env_name(const char *prefix, const char *setting, char *out, size_t cap);

/**
 * @brief Parse argv[first..argc): -F files first, then the environment (see use_env), then
 *        flags and -X, so the precedence is flag > environment > file > default. Handles -h/--help
 * by printing help for \p usage to stdout.
 * @returns 0, OQ_EHELP (help printed; exit 0), OQ_EINVAL (unknown setting, bad value, out of
 *          bounds, unreadable config file, bad environment value; \p err says which and where:
 *          "environment ONCEQ_PORT: setting --port: expected integer, got 'x'").
 */
int oq_config_parse_args(oq_config_t *c, const char *usage, int argc, char **argv, int first,
                         oq_error_t *err);

/** @brief Load a config file (see the file comment). Same errors as parse_args. */
int oq_config_load_file(oq_config_t *c, const char *path, oq_error_t *err);

/** @brief Set one onceq setting from text, validating type and bounds. */
int oq_config_set(oq_config_t *c, const char *name, const char *value, oq_error_t *err);

/** @brief Add one Kafka property (name without the "kafka." prefix). */
int oq_config_set_kafka(oq_config_t *c, const char *name, const char *value, oq_error_t *err);

/** Accessors. Asking for a name not in the table is a programming error: abort(). */
int64_t oq_config_int(const oq_config_t *c, const char *name);     /* INT, BOOL, DURATION, SIZE */
const char *oq_config_str(const oq_config_t *c, const char *name); /* STRING, ENUM; may be NULL */
int oq_config_is_set(const oq_config_t *c, const char *name); /* given explicitly by the user */
int oq_config_has(const oq_config_t *c, const char *name);    /* the table has this setting */

/** Positional arguments, in order (borrowed from argv). */
int oq_config_npositional(const oq_config_t *c);
const char *oq_config_positional(const oq_config_t *c, int i);

/** Kafka properties given with -X / kafka.* in file order (borrowed). */
int oq_config_kafka_count(const oq_config_t *c);
void oq_config_kafka_get(const oq_config_t *c, int i, const char **name, const char **value);

/**
 * @brief Apply the Kafka properties to a librdkafka conf (rd_kafka_conf_t *, passed as void *
 *        to keep librdkafka out of this header). Unknown property or bad value -> OQ_EINVAL.
 */
int oq_config_apply_kafka(const oq_config_t *c, void *rd_kafka_conf, oq_error_t *err);

/** @brief Print usage, then the settings table (name, type, default, bounds, doc). */
void oq_config_print_help(const oq_config_t *c, const char *usage, FILE *out);

#endif
