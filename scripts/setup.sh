#!/usr/bin/env bash
# Creates .venv (if missing) and installs the project with its test extras. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
# The Debian packages the crawler and its tests need, each installed when missing: all of them in one apt-get
# update and one install (each update costs a fresh machine tens of seconds).
#   chromium: the browser resolver drives a real Chromium, and its tests (and the status page's) run it;
#   systemd: the tests check the shipped units with systemd-analyze (verify, security);
#   ffmpeg, libchromaprint-tools: acoustic identification's tests and benchmark make a work's copies with ffmpeg's
#     command line and compare with Chromaprint's fpcalc (the daemons decode in-process with PyAV, whose wheel
#     brings its own FFmpeg libraries);
#   nginx-light: the crawl benchmark serves its site with nginx, and a test checks that nginx serves the generated
#     site as the test server does (the package's service is not started here);
#   postgresql: the master store's PostgreSQL backend is tested against a throwaway cluster the tests start
#     themselves (testkit/pgcluster.py: initdb into a temporary directory): the server programs, not a service.
missing=()
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
    missing+=(chromium)
fi
command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)
command -v ffmpeg >/dev/null 2>&1 || missing+=(ffmpeg)
command -v fpcalc >/dev/null 2>&1 || missing+=(libchromaprint-tools)
if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
    missing+=(nginx-light)
fi
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1; then
    missing+=(postgresql)
fi
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
        as_root=()
    elif command -v sudo >/dev/null 2>&1; then
        as_root=(sudo)
    else
        echo "setup: missing Debian packages; as root run: apt-get update && apt-get install -y ${missing[*]}" >&2
        exit 1
    fi
    "${as_root[@]}" apt-get update -q >/dev/null
    # Chromium with its recommended packages (fonts among them), as it was always installed; the rest without.
    lean=()
    for pkg in "${missing[@]}"; do
        if [ "$pkg" = chromium ]; then
            "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null
        else
            lean+=("$pkg")
        fi
    done
    if [ ${#lean[@]} -gt 0 ]; then
        "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
            apt-get install -y -q --no-install-recommends "${lean[@]}" >/dev/null
    fi
fi
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
if ! .venv/bin/python -c "import crawler, isal, pytest, warcio, wacz, prometheus_client, playwright, cryptography, psycopg, msgspec, mypy, xdist, av" \
        2>/dev/null \
   || [ pyproject.toml -nt .venv/.installed ]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -e '.[test]'
    touch .venv/.installed
fi
# The browser resolver never runs Chromium as root nor without its sandbox: it starts it as the unprivileged
# user crawler-browser (the worker's browser.user), which the tests' browsers run as too when they run as root.
# Chromium's sandbox puts its renderers in user namespaces, which some kernels keep from unprivileged users.
if ! getent passwd crawler-browser >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin \
            crawler-browser
    elif command -v sudo >/dev/null 2>&1; then
        sudo useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin \
            crawler-browser
    else
        echo "setup.sh: as root run: useradd --system --user-group --no-create-home --shell /usr/sbin/nologin" \
             "crawler-browser (the user the browser resolver runs Chromium as)" >&2
    fi
fi
for knob in kernel.unprivileged_userns_clone=1 kernel.apparmor_restrict_unprivileged_userns=0; do
    name=${knob%=*}
    if [ -e "/proc/sys/${name//.//}" ] && [ "$(sysctl -n "$name")" != "${knob#*=}" ]; then
        if [ "$(id -u)" = 0 ]; then
            sysctl -q -w "$knob"
        else
            echo "setup.sh: Chromium's sandbox needs user namespaces; as root run: sysctl -w $knob" >&2
        fi
    fi
done
# The package is installed editable, so nothing compiled its modules: where PYTHONDONTWRITEBYTECODE is set, every
# daemon (and every one the tests start) compiled them from source at each start, 0.1-0.15 s of CPU. Compiled once
# here, as an installed wheel's are (a module edited since is compiled again in memory: never stale).
.venv/bin/python -m compileall -q crawler
