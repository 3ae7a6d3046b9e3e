-- SPDX-License-Identifier: Apache-2.0
-- PostgreSQL schema `onceq`, version 2: onceq.submit(...), the producer's submit as a SQL
-- function, so a service in any language writes its call inside its own transaction:
--
--   SELECT * FROM onceq.submit('shop', 'order-1001-charge', 'charge',
--                              '{"amount":1999,"currency":"EUR"}'::jsonb);
--
-- The same rules as producer/decide.c: a new key -> a call (pending, attempt 1) and its outbox
-- row, outcome 'new'; the same key with the same arguments -> outcome 'replay' with the stored
-- call's status; a retryable failure submitted again -> attempt + 1 published (outcome 'new');
-- a settled call whose key expired is replaced by a new one; the same key with OTHER arguments
-- raises SQLSTATE 23505 with a message starting `idempotency_conflict`, so the caller's
-- transaction cannot commit by mistake. Bad input raises 22023 `invalid_request: ...` and
-- numbers RFC 8785 cannot represent 22003 `number_out_of_range: ...`.
--
-- The fingerprint is the C one byte for byte: SHA-256 of the RFC 8785 (JCS) text of
-- {"args":..,"tenant":..,"tool":..}. onceq.jcs() writes that text from jsonb:
--  - numbers: jsonb keeps a number as an exact decimal; JCS wants the ECMAScript form of the
--    IEEE double. The decimal is read as float8 (an overflow or an underflow to 0 is refused,
--    as the C parser refuses it), PostgreSQL's shortest round-trip output (extra_float_digits
--    = 1, set on the functions) gives the digits and the exponent, and those are laid out by
--    the ECMAScript rules (integer form below 1e21, 0.000001 down to 1e-6, else d.ddde+x).
--    An integer beyond +-2^53 has no exact double and is refused; so is any double in
--    (2^53, 1e21), which ECMAScript would print as an integer the C parser refuses.
--  - strings: only ", \ and the controls below U+0020 are escaped (\b \f \n \r \t, else
--    \u00xx in lowercase hex); everything else is written as UTF-8.
--  - object members sorted by the UTF-16 code units of their names (jsonb sorts by length,
--    then bytes: not the JCS order).
--  - containers nested deeper than 64 levels are refused (the C parser's limit).
-- What jsonb cannot show: a duplicate member name (jsonb keeps the last one; the C parser
-- refuses the text) and the literal form of a number (an integer literal of 1e21 or more, which
-- the C parser refuses as an integer overflow, reads here as the double 1e21).

CREATE FUNCTION onceq.jcs_string(t text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT AS $$
DECLARE
    r text := replace(replace(t, E'\\', E'\\\\'), '"', E'\\"');
    i int;
BEGIN
    IF r ~ '[\x01-\x1f]' THEN
        r := replace(r, chr(8), E'\\b');
        r := replace(r, chr(9), E'\\t');
        r := replace(r, chr(10), E'\\n');
        r := replace(r, chr(12), E'\\f');
        r := replace(r, chr(13), E'\\r');
        FOR i IN 1..31 LOOP
            IF i NOT IN (8, 9, 10, 12, 13) THEN
                r := replace(r, chr(i), E'\\u00' || lpad(to_hex(i), 2, '0'));
            END IF;
        END LOOP;
    END IF;
    RETURN '"' || r || '"';
END $$;

CREATE FUNCTION onceq.jcs_number(n numeric) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT SET extra_float_digits = 1 AS $$
DECLARE
    d float8;
    s text;
    neg boolean;
    mant text;
    e int := 0;
    p int;
    ip text;
    digits text;
    k int;
    x int;   -- value = 0.digits * 10^x
    r text;
BEGIN
    IF scale(n) = 0 AND abs(n) > 9007199254740992 AND abs(n) < 1e21 THEN
        RAISE EXCEPTION USING ERRCODE = '22003',
            MESSAGE = format('number_out_of_range: integer %s is outside +-2^53; RFC 8785 numbers are IEEE doubles', n);
    END IF;
    BEGIN
        d := n::float8;
    EXCEPTION WHEN numeric_value_out_of_range THEN
        RAISE EXCEPTION USING ERRCODE = '22003',
            MESSAGE = format('number_out_of_range: %s does not fit an IEEE double', left(n::text, 40));
    END;
    IF d = 0 THEN
        IF n <> 0 THEN
            RAISE EXCEPTION USING ERRCODE = '22003',
                MESSAGE = format('number_out_of_range: %s would read as 0', left(n::text, 40));
        END IF;
        RETURN '0';
    END IF;
    IF abs(d) > 9007199254740992 AND abs(d) < 1e21 THEN
        RAISE EXCEPTION USING ERRCODE = '22003',
            MESSAGE = format('number_out_of_range: %s is an integer outside +-2^53 as a double', left(n::text, 40));
    END IF;
    IF abs(d) <= 9007199254740992 AND d = trunc(d) THEN
        RETURN d::bigint::text; -- exact (float8 to numeric would keep 15 digits only)
    END IF;
    s := d::text;
    neg := left(s, 1) = '-';
    IF neg THEN s := substr(s, 2); END IF;
    p := position('e' IN s);
    IF p > 0 THEN
        mant := left(s, p - 1);
        e := substr(s, p + 1)::int;
    ELSE
        mant := s;
    END IF;
    p := position('.' IN mant);
    IF p > 0 THEN
        ip := left(mant, p - 1);
        digits := ip || substr(mant, p + 1);
    ELSE
        ip := mant;
        digits := mant;
    END IF;
    x := length(ip) + e;
    WHILE left(digits, 1) = '0' LOOP
        digits := substr(digits, 2);
        x := x - 1;
    END LOOP;
    digits := rtrim(digits, '0');
    k := length(digits);
    IF k <= x AND x <= 21 THEN
        r := digits || repeat('0', x - k);
    ELSIF 0 < x AND x <= 21 THEN
        r := left(digits, x) || '.' || substr(digits, x + 1);
    ELSIF -6 < x AND x <= 0 THEN
        r := '0.' || repeat('0', -x) || digits;
    ELSE
        r := left(digits, 1);
        IF k > 1 THEN r := r || '.' || substr(digits, 2); END IF;
        r := r || 'e' || CASE WHEN x - 1 < 0 THEN '-' ELSE '+' END || abs(x - 1)::text;
    END IF;
    RETURN CASE WHEN neg THEN '-' || r ELSE r END;
END $$;

-- The sort key of a member name in UTF-16 code-unit order: 4 hex digits per code unit (a
-- character above U+FFFF as its surrogate pair), compared with COLLATE "C".
CREATE FUNCTION onceq.utf16_key(t text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT COALESCE(string_agg(CASE WHEN cp < 65536 THEN lpad(to_hex(cp), 4, '0')
                               ELSE to_hex(55296 + ((cp - 65536) >> 10))
                                    || to_hex(56320 + ((cp - 65536) & 1023)) END,
                               '' ORDER BY i), '')
    FROM (SELECT ascii(c) AS cp, i FROM regexp_split_to_table(t, '') WITH ORDINALITY AS x(c, i)) y
$$;

CREATE FUNCTION onceq.jcs(v jsonb, depth int DEFAULT 1) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT SET extra_float_digits = 1 AS $$
DECLARE
    r text;
BEGIN
    CASE jsonb_typeof(v)
    WHEN 'object' THEN
        IF depth > 64 THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = 'invalid_request: JSON nested deeper than 64 levels';
        END IF;
        -- Below U+E000 UTF-8 byte order is UTF-16 order: the cheap key serves then.
        IF EXISTS (SELECT 1 FROM jsonb_object_keys(v) k WHERE k ~ '[\uE000-\U0010FFFF]') THEN
            SELECT string_agg(onceq.jcs_string(key) || ':' || onceq.jcs(value, depth + 1), ','
                              ORDER BY onceq.utf16_key(key) COLLATE "C")
              INTO r FROM jsonb_each(v);
        ELSE
            SELECT string_agg(onceq.jcs_string(key) || ':' || onceq.jcs(value, depth + 1), ','
                              ORDER BY key COLLATE "C")
              INTO r FROM jsonb_each(v);
        END IF;
        RETURN '{' || COALESCE(r, '') || '}';
    WHEN 'array' THEN
        IF depth > 64 THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = 'invalid_request: JSON nested deeper than 64 levels';
        END IF;
        SELECT string_agg(onceq.jcs(e, depth + 1), ',' ORDER BY i) INTO r
          FROM jsonb_array_elements(v) WITH ORDINALITY AS a(e, i);
        RETURN '[' || COALESCE(r, '') || ']';
    WHEN 'string' THEN
        RETURN onceq.jcs_string(v #>> '{}');
    WHEN 'number' THEN
        RETURN onceq.jcs_number((v #>> '{}')::numeric);
    WHEN 'boolean' THEN
        RETURN v::text;
    ELSE
        RETURN 'null';
    END CASE;
END $$;

-- The call fingerprint (`onceq fingerprint`): lowercase hex SHA-256 of the JCS text of
-- {"args":args,"tenant":tenant,"tool":tool}.
CREATE FUNCTION onceq.fingerprint(tenant text, tool text, args jsonb) RETURNS text
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT encode(sha256(convert_to('{"args":' || onceq.jcs(args) || ',"tenant":'
                                    || onceq.jcs_string(tenant) || ',"tool":'
                                    || onceq.jcs_string(tool) || '}', 'UTF8')), 'hex')
$$;

-- A time-ordered id: 12 hex digits of unix ms, then random hex from gen_random_uuid() (the
-- server's CSPRNG; its version and variant digits are skipped).
CREATE FUNCTION onceq.new_call_id(now_ms bigint) RETURNS text
LANGUAGE sql VOLATILE AS $$
    SELECT 'c_' || lpad(to_hex(now_ms), 12, '0') || substr(r, 1, 12) || substr(r, 18, 8)
    FROM (SELECT replace(gen_random_uuid()::text, '-', '') AS r) x
$$;

-- A UUID version 7 (unix ms first), as the C side's oq_id_uuid().
CREATE FUNCTION onceq.new_message_id(now_ms bigint) RETURNS text
LANGUAGE sql VOLATILE AS $$
    SELECT left(h, 8) || '-' || substr(h, 9, 4) || '-' || substr(h, 13, 4) || '-'
           || substr(h, 17, 4) || '-' || substr(h, 21, 12)
    FROM (SELECT lpad(to_hex(now_ms), 12, '0') || '7' || substr(r, 1, 3)
                 || substr('89ab', 1 + (('x' || substr(r, 4, 1))::bit(4)::int & 3), 1)
                 || substr(r, 5, 3) || substr(r, 18, 12) AS h
          FROM (SELECT replace(gen_random_uuid()::text, '-', '') AS r) x) y
$$;

-- The tool_call envelope of one attempt, written as common/envelope.c writes it (members in
-- JCS order, args as their canonical text).
CREATE FUNCTION onceq.call_envelope(args_canon text, attempt bigint, call_id text,
                                    created_at bigint, fingerprint text, idem_key text,
                                    message_id text, tenant text, tool text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT '{"args":' || args_canon || ',"attempt":' || attempt || ',"call_id":'
           || onceq.jcs_string(call_id) || ',"created_at":' || created_at || ',"fingerprint":'
           || onceq.jcs_string(fingerprint) || ',"idem_key":' || onceq.jcs_string(idem_key)
           || ',"kind":"tool_call","message_id":' || onceq.jcs_string(message_id)
           || ',"tenant":' || onceq.jcs_string(tenant) || ',"tool":' || onceq.jcs_string(tool)
           || ',"v":1}'
$$;

CREATE FUNCTION onceq.submit(tenant text, idem_key text, tool text, args jsonb,
                             client_id text DEFAULT NULL)
RETURNS TABLE(call_id text, outcome text, status text)
LANGUAGE plpgsql VOLATILE SET extra_float_digits = 1 AS $$
DECLARE
    t text := COALESCE(NULLIF(tenant, ''), 'default');
    k text := idem_key;
    tl text := tool;
    canon text;
    fp text;
    now_ms bigint := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    ttl bigint := COALESCE(NULLIF(current_setting('onceq.key_ttl_ms', true), '')::bigint,
                           86400000);
    max_bytes bigint := COALESCE(NULLIF(current_setting('onceq.max_message_bytes', true), '')::bigint,
                                 1000000);
    cid text;
    mid text;
    payload text;
    c onceq.calls%ROWTYPE;
    tries int := 0;
BEGIN
    IF k IS NULL OR k !~ '^[\x20-\x7e]{1,255}$' THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = 'invalid_request: idempotency key must be 1-255 printable ASCII bytes';
    END IF;
    IF t !~ '^[\x20-\x7e]{1,128}$' THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = 'invalid_request: tenant must be 1-128 printable ASCII bytes';
    END IF;
    IF tl IS NULL OR tl !~ '^[A-Za-z0-9_.:-]{1,128}$' THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = 'invalid_request: tool must be 1-128 bytes of [A-Za-z0-9_.:-]';
    END IF;
    IF client_id IS NOT NULL AND client_id !~ '^[\x20-\x7e]{1,128}$' THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = 'invalid_request: client_id must be 1-128 printable ASCII bytes';
    END IF;
    IF args IS NULL OR jsonb_typeof(args) <> 'object' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'invalid_request: args must be a JSON object';
    END IF;
    canon := onceq.jcs(args);
    fp := encode(sha256(convert_to('{"args":' || canon || ',"tenant":' || onceq.jcs_string(t)
                                   || ',"tool":' || onceq.jcs_string(tl) || '}', 'UTF8')), 'hex');
    LOOP
        cid := onceq.new_call_id(now_ms);
        mid := onceq.new_message_id(now_ms);
        payload := onceq.call_envelope(canon, 1, cid, now_ms, fp, k, mid, t, tl);
        -- 1. a new key (a message the relay could not publish is refused before anything)
        IF octet_length(payload) + 132 <= max_bytes THEN
            INSERT INTO onceq.calls AS x (call_id, tenant, idem_key, fingerprint, tool, args, state,
                                         attempt, client_id, created_at, updated_at, expires_at,
                                         message_id)
            VALUES (cid, t, k, fp, tl, canon, 'pending', 1, client_id, now_ms, now_ms,
                    now_ms + ttl, mid)
            ON CONFLICT DO NOTHING;
            IF FOUND THEN
                INSERT INTO onceq.outbox (message_id, topic, key, payload, created_at)
                VALUES (mid, 'onceq.tool-calls', cid, payload, now_ms);
                RETURN QUERY SELECT cid, 'new'::text, 'pending'::text;
                RETURN;
            END IF;
        END IF;
        -- 2. the key exists (or only the call id: then draw another)
        SELECT * INTO c FROM onceq.calls x WHERE x.tenant = t AND x.idem_key = k FOR UPDATE;
        IF NOT FOUND THEN
            IF octet_length(payload) + 132 > max_bytes THEN
                RAISE EXCEPTION USING ERRCODE = '54000', MESSAGE = format(
                    'too_large: the call''s Kafka message would be %s bytes, over the %s bytes '
                    'the relay can publish', octet_length(payload) + 132, max_bytes);
            END IF;
            tries := tries + 1;
            IF tries > 3 THEN
                RAISE EXCEPTION 'onceq.submit: call id taken % times in a row', tries;
            END IF;
            CONTINUE;
        END IF;
        IF c.state IN ('succeeded', 'failed', 'needs_review') AND c.expires_at <= now_ms THEN
            DELETE FROM onceq.audit a WHERE a.call_id = c.call_id;
            DELETE FROM onceq.result_inbox r WHERE r.call_id = c.call_id;
            DELETE FROM onceq.calls x WHERE x.call_id = c.call_id;
            CONTINUE; -- now a new key
        END IF;
        EXIT;
    END LOOP;
    -- 3. the same key for another request
    IF c.fingerprint <> fp THEN
        RAISE EXCEPTION USING ERRCODE = '23505', MESSAGE = format(
            'idempotency_conflict: key %s of tenant %s already names call %s with other arguments',
            k, t, c.call_id);
    END IF;
    -- 4. a retryable failure, submitted again: the next attempt
    IF c.state = 'failed' AND onceq.try_jsonb(c.error) -> 'retryable' = 'true'::jsonb THEN
        payload := onceq.call_envelope(c.args, c.attempt + 1, c.call_id, now_ms, c.fingerprint,
                                       c.idem_key, mid, c.tenant, c.tool);
        IF octet_length(payload) + 132 > max_bytes THEN
            RAISE EXCEPTION USING ERRCODE = '54000',
                MESSAGE = 'too_large: the next attempt''s Kafka message is over the relay''s limit';
        END IF;
        UPDATE onceq.calls x SET state = 'pending', attempt = c.attempt + 1, result = NULL,
               error = NULL, updated_at = now_ms, expires_at = now_ms + ttl, message_id = mid,
               redrive_count = 0, next_redrive_at = NULL, settled_at = NULL
         WHERE x.call_id = c.call_id;
        INSERT INTO onceq.outbox (message_id, topic, key, payload, created_at)
        VALUES (mid, 'onceq.tool-calls', c.call_id, payload, now_ms);
        INSERT INTO onceq.audit (ts, call_id, event, detail)
        VALUES (now_ms, c.call_id, 'retry_reset', '{"attempt":' || (c.attempt + 1) || '}');
        RETURN QUERY SELECT c.call_id, 'new'::text, 'pending'::text;
        RETURN;
    END IF;
    -- 5. the same request again
    RETURN QUERY SELECT c.call_id, 'replay'::text, c.state;
END $$;
