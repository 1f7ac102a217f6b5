#!/bin/sh
# Hands the checkpoint's directory on the weights volume to the user the staging
# program runs as (infra/k8s/staging.py): the weight-staging Job's init
# container, the one step of the Job that runs as root, with CAP_CHOWN alone.
# EFS and FSx for Lustre create a file system's root directory owned by root
# (mode 0755), so an unprivileged program could not create the checkpoint's
# directory; a directory an earlier Job left (root's, or another user's) is
# handed over with everything in it. POSIX sh.
#
#   sh staging_owner.sh DIR UID:GID
set -eu
dir="$1"
owner="$2"
mkdir -p "$dir"
chown -R "$owner" "$dir"
echo "staging directory $dir belongs to $owner"
