# kilnd_env.sh: sourced by the scripts that serve a real kilnd for a test
# (tests/net/serve.sh, tests/reliability/soak.sh): development certificates and tokens,
# the common kiln.ini, and starting kilnd until it says it is serving.

# kt_certs_tokens DIR KILND HOSTS: DIR/tls/ (certificates naming HOSTS, comma-separated)
# and DIR/tokens.txt; sets UTOK and ATOK.
kt_certs_tokens() {
  "$2" certs --dir "$1/tls" --hosts "$3" >/dev/null
  UTOK=user-$(od -An -N8 -tx8 /dev/urandom | tr -d ' ')
  ATOK=admin-$(od -An -N8 -tx8 /dev/urandom | tr -d ' ')
  printf '# role token\nuser %s\nadmin %s\n' "$UTOK" "$ATOK" >"$1/tokens.txt"
}

# kt_ini DIR MODEL NET PORT MPORT ENGINE_LINES: DIR/kiln.ini with [net] last, so a caller
# may append [net] keys directly (or other sections with their headers).
kt_ini() {
  printf '[model]\npath = %s\n[engine]\nthreads = 2\ndefault_max_tokens = 64\n%s\n' "$2" "$6" >"$1/kiln.ini"
  printf '[sampling]\ntemperature = 0.7\n[net]\n%s\nlisten = 0.0.0.0:%s\nmetrics_port = %s\n' \
    "$3" "$4" "$5" >>"$1/kiln.ini"
  printf 'cert = %s\nkey = %s\ntokens_file = %s\nmax_output_bytes = 16K\n' \
    "$1/tls/server.crt" "$1/tls/server.key" "$1/tokens.txt" >>"$1/kiln.ini"
}

# kt_start NAME DIR CMD...: runs CMD (a kilnd serve, with its netns prefix) in the
# background with output in DIR/kilnd.out and .err, sets PID, and waits (up to 30 s)
# for its "kilnd: serving" line; exits the calling script with the reason otherwise.
kt_start() {
  local name=$1 dir=$2
  shift 2
  "$@" >"$dir/kilnd.out" 2>"$dir/kilnd.err" &
  PID=$!
  for _ in $(seq 1 300); do
    grep -q "kilnd: serving" "$dir/kilnd.out" 2>/dev/null && break
    kill -0 "$PID" 2>/dev/null || { echo "$name: kilnd exited early:"; cat "$dir/kilnd.err"; exit 1; }
    sleep 0.1
  done
  grep -q "kilnd: serving" "$dir/kilnd.out" || { echo "$name: kilnd did not come up"; cat "$dir/kilnd.err"; exit 1; }
  cat "$dir/kilnd.out"
}
