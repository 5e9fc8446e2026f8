# Sourced by .ci/run (it uses apt_install): makes sure a Valkey server can be
# started and sets VALKEY_SERVER to a path that starts it.
#
# Debian ships Valkey 8 for bookworm in bookworm-backports, as valkey-tools:
# its valkey-check-rdb is the whole server binary, which picks its mode by the
# name it is run under (valkey-server or redis-server: a server). The
# valkey-server package only adds that symlink and a system service, which CI
# does not want, so CI installs valkey-tools and makes the symlink itself.

# debian_mirror prints the Debian archive URI of the existing apt entries
# (deb822 .sources or one-line .list), so that backports comes from the same
# mirror.
debian_mirror() {
  {
    grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | cut -d: -f2-
    grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list
  } | tr ' ' '\n' | grep -E '^[a-z]+://.*/debian/?$' | head -1 || true
}

if ! command -v valkey-server >/dev/null 2>&1 && ! command -v valkey-check-rdb >/dev/null 2>&1; then
  [ -n "$apt_updated" ] || { apt-get update -qq; apt_updated=1; }
  candidate=$(apt-cache policy valkey-tools 2>/dev/null | sed -n 's/^ *Candidate: //p')
  if [ -z "$candidate" ] || [ "$candidate" = "(none)" ]; then
    codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
    mirror=$(debian_mirror)
    if [ "$codename" != bookworm ] || [ -z "$mirror" ]; then
      echo "ci: no valkey-tools package, and no Debian bookworm entry to add backports to (codename '$codename', mirror '$mirror')"
      exit 1
    fi
    echo "ci: adding $codename-backports from $mirror"
    cat >/etc/apt/sources.list.d/"$codename"-backports.sources <<SOURCES
Types: deb
URIs: $mirror
Suites: $codename-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
    apt_updated=
  fi
  echo "ci: installing valkey-tools"
  apt_install valkey-tools
fi

if command -v valkey-server >/dev/null 2>&1; then
  VALKEY_SERVER=$(command -v valkey-server)
else
  valkey_dir=$(mktemp -d)
  trap 'rm -rf "$valkey_dir"' EXIT
  ln -s "$(command -v valkey-check-rdb)" "$valkey_dir/valkey-server"
  VALKEY_SERVER=$valkey_dir/valkey-server
fi
valkey_version=$("$VALKEY_SERVER" --version 2>&1 || true)
case "$valkey_version" in
"Valkey server v="*) echo "$valkey_version" ;;
*) echo "ci: $VALKEY_SERVER is not a Valkey server: $valkey_version"; exit 1 ;;
esac
