# Sourced by bin/plan and bin/test (not run on its own).
#   ensure_venv FILE [DIR]: virtualenv DIR (default ./venv) with requirement FILE
#   installed. It is created on first use; FILE is installed again only when it, or a
#   file it includes with `-r` (followed recursively, as pip reads them), changed since
#   the last install. The stamp, DIR/.FILE-without-.txt.sha256, holds the sha256 of
#   those files: for a file that includes none (requirements-scan.txt into venv-scan/)
#   that is the stamp `python -m infra scan` writes and reads too (infra/preview/tool_venv.py),
#   so neither installs again what the other did.
#   ensure_venvs FILE:DIR...: ensure_venv for each pair at the same time (pip is
#   single-threaded and partly waits on the network), each one's output in its own
#   log, printed when it is done; a failed one's log goes to stderr under the name of
#   the virtualenv, and ensure_venvs returns 1 if any failed (after waiting for all).
# pip installs into ./venv without byte-compiling (--no-compile): compiling every module of
# every package took half of a fresh set-up (pulumi_aws alone is 270 MB of Python, of which
# the program imports a few dozen modules). Python compiles a module on its first import
# instead and keeps the result in __pycache__/, which it may only do when
# PYTHONDONTWRITEBYTECODE is unset: with it set, every process would compile again what
# it imports (8 s more for each synthesis of prod on 2 cores). venv-scan/ is compiled at
# install: checkov runs with PYTHONDONTWRITEBYTECODE=1 (infra/preview/scan.py OFFLINE_ENV).
unset PYTHONDONTWRITEBYTECODE
ensure_venv() {
    local req="$1" dir="${2:-venv}" stamp sum compile=--no-compile
    [ "$dir" != venv-scan ] || compile=--compile
    stamp="$dir/.${req%.txt}.sha256"
    if [ ! -x "$dir/bin/python" ]; then
        python3 -m venv "$dir"
    fi
    sum=$("$dir/bin/python" - "$req" <<'PY'
import hashlib, re, sys
from pathlib import Path

h, seen = hashlib.sha256(), []

def visit(path: Path) -> None:
    if path in seen:
        return
    seen.append(path)
    h.update(path.read_bytes())
    for line in path.read_text().splitlines():
        m = re.match(r"\s*(?:-r|--requirement)[\s=]+(\S+)", line)
        if m:
            visit(path.parent / m[1])

visit(Path(sys.argv[1]))
print(h.hexdigest())
PY
)
    if [ "$(cat "$stamp" 2>/dev/null || true)" != "$sum" ]; then
        "$dir/bin/python" -m pip install --quiet --disable-pip-version-check "$compile" -r "$req"
        echo "$sum" > "$stamp"
    fi
}

ensure_venvs() {
    local pair logs pids=() names=() i failed=0
    logs=$(mktemp -d)
    for pair in "$@"; do
        names+=("$pair")
        ensure_venv "${pair%%:*}" "${pair#*:}" >"$logs/${#names[@]}.log" 2>&1 &
        pids+=($!)
    done
    for i in "${!pids[@]}"; do
        if ! wait "${pids[$i]}"; then
            echo "setting up ${names[$i]#*:}/ from ${names[$i]%%:*} failed:" >&2
            cat "$logs/$((i + 1)).log" >&2
            failed=1
        else
            cat "$logs/$((i + 1)).log"
        fi
    done
    rm -rf "$logs"
    return "$failed"
}
