"""The programs that run in pods, as files.

`infra/k8s/script_files.py` ships them in ConfigMaps, mounted read-only at
`/opt/gpu-serving`; the containers run them from there with their parameters
as arguments. The Python ones need only the standard library at import (a
source's client or torch is imported where it is used) and run on Python 3.8+,
so the builders and the tests import their constants and pure functions
directly. The shell ones are POSIX `sh` (`#!/bin/sh`) or bash (`#!/bin/bash`),
as their first line says.
"""
