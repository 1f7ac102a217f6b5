# Sourced by bin/plan and bin/test (not run on its own).
#   ensure_venv FILE: ./venv with requirement FILE installed. The venv is created on
#   first use; FILE is installed again only when it, or a file it includes with
#   `-r` (followed recursively, as pip reads them), changed since the last install.
ensure_venv() {
    local req="$1" stamp="venv/.${1%.txt}.sha256" sum
    if [ ! -x venv/bin/python ]; then
        python3 -m venv venv
    fi
    sum=$(venv/bin/python - "$req" <<'PY'
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
        venv/bin/python -m pip install --quiet --disable-pip-version-check -r "$req"
        echo "$sum" > "$stamp"
    fi
}
