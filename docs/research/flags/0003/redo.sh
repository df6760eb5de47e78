#!/bin/bash
set -e
cd /tmp/flags-work
declare -A AT=( [0.5.10]=">=0.5.10,<0.5.14" [0.5.10.post1]=">=0.5.10,<0.5.14" [0.5.14]=">=0.5.14,<0.5.15" [0.5.15]=">=0.5.15,<0.5.19" [0.5.19]=">=0.5.19,<0.5.21" [0.5.23]=">=0.5.21" )
for v in 0.5.10 0.5.10.post1 0.5.14 0.5.15 0.5.19 0.5.23; do (cd $v && git reset -q --hard $(git rev-list --max-parents=0 HEAD)); done
python3 gen/mk.py
python3 - <<'PY'
for v in ("0.5.14", "0.5.15"):
    p = f"/tmp/flags-work/{v}/python/sglang/srt/server_args.py"
    s = open(p).read()
    i = s.index("from sglang.srt.utils.common import (\n")
    j = s.index("    get_device,\n", i)
    s = s[:j] + "    get_bool_env_var,\n" + s[j:]
    open(p, "w").write(s)
PY
for v in 0.5.10 0.5.10.post1 0.5.14 0.5.15 0.5.19 0.5.23; do (cd $v && { cat ../msg/body.txt; echo "Applies-To: ${AT[$v]}"; } > ../msg/$v.txt && git add -A python && GIT_AUTHOR_NAME=sglpatch GIT_AUTHOR_EMAIL=sglpatch@localhost GIT_COMMITTER_NAME=sglpatch GIT_COMMITTER_EMAIL=sglpatch@localhost GIT_AUTHOR_DATE="Mon, 30 Nov 2026 12:00:00 +0000" GIT_COMMITTER_DATE="Mon, 30 Nov 2026 12:00:00 +0000" git commit -q -F ../msg/$v.txt && rm -rf ../out/$v && git format-patch -q -1 --zero-commit -o ../out/$v); done
W=/work/wt-flags/patches; S=0003-amd-glm5-mi355x-aiter-allreduce-fusion-fp8-kv-default
mkdir -p $W/renditions/$S
cp out/0.5.10/*.patch $W/$S.patch
for v in 0.5.14 0.5.15 0.5.19 0.5.23; do cp out/$v/*.patch $W/renditions/$S/$v.patch; done
