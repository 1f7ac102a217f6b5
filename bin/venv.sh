# Sourced by bin/plan and bin/test (not run on its own).
#   ensure_venv FILE [DIR]: virtualenv DIR (default ./venv) with requirement FILE
#   installed. It is created on first use; FILE is installed again only when it, or a
#   file it includes with `-r` (followed recursively, as pip reads them), changed since
#   the last install. The stamp, DIR/.FILE-without-.txt.sha256, holds the sha256 of
#   those files: for a file that includes none (requirements-scan.txt into venv-scan/)
#   that is the stamp `python -m infra scan` writes and reads too (infra/preview/tool_venv.py),
#   so neither installs again what the other did.
#   ensure_venvs FILE:DIR...: ensure_venv for each pair at the same time (each install
#   partly waits on the network), each one's output in its own log, printed when it is
#   done; a failed one's log goes to stderr under the name of the virtualenv, and
#   ensure_venvs returns 1 if any failed (after waiting for all).
#   ensure_uv: the installer, uv, at .tools/uv/bin/uv (requirements-uv.txt, by hash; pip
#   puts it there once, with --target, and again only when that file changed).
# uv installs the requirement files, not pip: the same pinned files give the same packages,
# in about 10 s for ./venv where pip took 75 s of CPU on 2 cores (it resolves, unpacks and
# writes in one thread), and the set-up of a fresh clone is part of its test time.
# ./venv is installed without byte-compiling (uv's default, as pip's --no-compile):
# compiling every module of every package would take longer than the install (pulumi_aws
# alone is 270 MB of Python, of which the program imports a few dozen modules). Python
# compiles a module on its first import instead and keeps the result in __pycache__/,
# which it may only do when PYTHONDONTWRITEBYTECODE is unset: with it set, every process
# would compile again what it imports (8 s more for each synthesis of prod on 2 cores).
# venv-scan/ is compiled at install (--compile-bytecode): checkov runs with
# PYTHONDONTWRITEBYTECODE=1 (infra/preview/scan.py OFFLINE_ENV).
unset PYTHONDONTWRITEBYTECODE
UV=.tools/uv/bin/uv
ensure_uv() {
    local stamp=.tools/uv/.requirements-uv.sha256 sum
    sum=$(python3 -c 'import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())' requirements-uv.txt)
    if [ -x "$UV" ] && [ "$(cat "$stamp" 2>/dev/null || true)" = "$sum" ]; then
        return 0
    fi
    rm -rf .tools/uv
    # Into a directory of its own (uv is one program), not a virtualenv: making one costs 6 s.
    python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --require-hashes --target .tools/uv -r requirements-uv.txt
    echo "$sum" > "$stamp"
}

ensure_venv() {
    local req="$1" dir="${2:-venv}" stamp sum compile=()
    [ "$dir" != venv-scan ] || compile=(--compile-bytecode)
    ensure_uv
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
        "$UV" pip install --quiet --python "$dir/bin/python" ${compile[@]+"${compile[@]}"} -r "$req"
        echo "$sum" > "$stamp"
    fi
}

ensure_venvs() {
    local pair logs pids=() names=() i failed=0
    ensure_uv  # once, before the installs that use it start at the same time
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
