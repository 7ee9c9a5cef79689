#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image (Ubuntu 22.04):
# it installs what grading needs into the python3 on PATH (the system's; it is not replaced)
# and makes the unprivileged account the students' notebooks run as.
#   TRANSFORMER_LIB_SOURCE  what pip installs as the library (default: the release the
#                           handouts pin; a local path or a wheel works too)
#   AUTOGRADER_USER         the account the notebooks run as (default: student)
# Written by tools/gradescope.py, which fills in the release, the index and the versions.
set -euo pipefail
source="${TRANSFORMER_LIB_SOURCE:-@LIBRARY@}"
user="${AUTOGRADER_USER:-student}"

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  missing=""
  python3 -m pip --version >/dev/null 2>&1 || missing="$missing python3-pip"
  case "$source" in git+*) command -v git >/dev/null || missing="$missing git" ;; esac
  if [ -n "$missing" ]; then
    apt-get update -qq
    # shellcheck disable=SC2086  # one word per package
    apt-get install -y -qq $missing >/dev/null
  fi
fi

# PyTorch's CPU build first (the default one brings CUDA's libraries, gigabytes of them),
# then the library and the notebook runner. No cache: the image stays smaller.
python3 -m pip install --no-cache-dir --quiet --index-url @TORCH_INDEX@ "@TORCH@"
python3 -m pip install --no-cache-dir --quiet "$source" @GRADING_PACKAGES@

if [ "$(id -u)" = 0 ] && ! id -u "$user" >/dev/null 2>&1; then
  useradd --system --no-create-home --shell /usr/sbin/nologin "$user"
fi

# Fail here, at upload time, rather than on the first submission.
python3 -c "import importlib.metadata as m, nbclient, ipykernel, transformer_lib.checks
print('grading with transformer_lib', m.version('transformer_lib'))"
