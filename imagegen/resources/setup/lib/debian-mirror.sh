# Sourced by install-engine.sh and install-registry.sh beside it and by a clone's scripts/make-base-image.sh
# (never hard-code a mirror host).
# mirror_uri [SUITE]: the URI of this machine's own Debian mirror: the debian.sources stanza whose
# Suites holds SUITE (default: this release's codename; not -security / -updates), else the first
# URIs line; /etc/apt/sources.list as a fallback. Prints it, or returns 1.
mirror_uri() {
    local suite=${1:-} uri="" sources=${SOURCES:-/etc/apt/sources.list.d/debian.sources}
    [ -n "$suite" ] || suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
    if [ -r "$sources" ]; then
        uri=$(awk -v c="$suite" 'BEGIN { RS = ""; FS = "\n" }
            { u = ""; s = 0
              for (i = 1; i <= NF; i++) {
                  if ($i ~ /^URIs:/) { split($i, a, /[ \t]+/); u = a[2] }
                  if ($i ~ /^Suites:/) { n = split($i, b, /[ \t]+/); for (j = 2; j <= n; j++) if (b[j] == c) s = 1 }
              }
              if (u != "" && s) { print u; exit } }' "$sources")
        [ -n "$uri" ] || uri=$(awk '/^URIs:/ { print $2; exit }' "$sources")
    fi
    if [ -z "$uri" ] && [ -r /etc/apt/sources.list ]; then
        uri=$(awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i !~ /^\[/ && $i !~ /\]$/) { print $i; exit } }' /etc/apt/sources.list)
    fi
    [ -n "$uri" ] || return 1
    echo "$uri"
}
