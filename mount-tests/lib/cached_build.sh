# Sourced by the scripts that build one tool once into OUT (mount-tests/cri/make_crictl.sh,
# mount-tests/nerdctl/make_nerdctl.sh): the stamp, the lock and the swap they share.
#
#   OUT=...; cached_build_begin BIN STAMP   # exits printing OUT/bin/BIN if OUT holds a
#                                            # build stamped STAMP; else NEW=OUT.new, empty,
#                                            # with NEW/bin, under OUT's lock
#   ... build NEW/bin/BIN ...
#   cached_build_end                         # stamps NEW, puts it in OUT's place, prints
#                                            # OUT/bin/BIN
#
# Idempotent; a concurrent run waits on the lock, then finds the build done.

cached_build_complete() {
    [[ -f $OUT/.complete && $(<"$OUT/.complete") == "$CACHED_STAMP" && -x $OUT/bin/$CACHED_BIN ]]
}

cached_build_begin() {
    CACHED_BIN=$1
    CACHED_STAMP=$2
    if cached_build_complete; then echo "$OUT/bin/$CACHED_BIN"; exit 0; fi
    mkdir -p "$(dirname "$OUT")"
    exec 9>"$OUT.lock"
    flock 9
    if cached_build_complete; then echo "$OUT/bin/$CACHED_BIN"; exit 0; fi
    NEW=$OUT.new
    rm -rf "$NEW"
    mkdir -p "$NEW/bin"
}

cached_build_end() {
    echo "$CACHED_STAMP" >"$NEW/.complete"
    rm -rf "$OUT"
    mv "$NEW" "$OUT"
    echo "$OUT/bin/$CACHED_BIN"
}
