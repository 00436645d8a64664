#!/usr/bin/env bash
# install-engines.sh — install the chess engines chessd runs, outside the checkout.
#
#   scripts/install-engines.sh            # install what is missing (no-op when complete)
#   scripts/install-engines.sh --verify   # also re-check every installed engine answers UCI
#
# Layout under ${CHESSD_ENGINES_DIR:-$HOME/.cache/chessd/engines} (see docs/ENGINES.md):
#   sf-17.1/stockfish       Stockfish 17.1, native, built from Debian trixie's source package
#   sf-17.1/wasm/           Stockfish 17.1 lite single-threaded WebAssembly (npm stockfish@17.1.0)
#   sf-17.1/stockfish-wasm  launcher: exec node on the wasm build (a UCI process on stdin/stdout)
#   sf-15.1/stockfish       Stockfish 15.1, Debian bookworm's binary package
#   .downloads/             verified source archives, kept so nothing is downloaded twice
#   .apt/                   private apt state for the trixie deb-src index (system apt untouched)
#
# Every final artefact is prepared in a temporary directory on the same filesystem and
# renamed into place, so an interrupted run never leaves something that looks installed.
set -euo pipefail

ENGINES_DIR=${CHESSD_ENGINES_DIR:-$HOME/.cache/chessd/engines}
SF17_DIR="$ENGINES_DIR/sf-17.1"
SF15_DIR="$ENGINES_DIR/sf-15.1"
DL_DIR="$ENGINES_DIR/.downloads"
APT_DIR="$ENGINES_DIR/.apt"
NPM_SPEC="stockfish@17.1.0"
JOBS=${CHESSD_BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}

VERIFY=0
for arg in "$@"; do
	case "$arg" in
	--verify) VERIFY=1 ;;
	-h | --help)
		sed -n '2,16p' "$0"
		exit 0
		;;
	*)
		echo "install-engines: unknown argument: $arg" >&2
		exit 2
		;;
	esac
done

say() { printf 'install-engines: %s\n' "$*"; }
die() {
	printf 'install-engines: ERROR: %s\n' "$*" >&2
	exit 1
}

# uci_id_name CMD... — start a UCI engine, send "uci", print its "id name" value.
# The engine's stdin stays open until "uciok": the WebAssembly build handles input
# asynchronously and exits on EOF before answering, so "printf 'uci\nquit\n' | engine"
# is not enough for it.
uci_id_name() {
	local name="" line
	coproc ENGINE { "$@" 2>/dev/null; }
	# Copy the coprocess fds: bash unsets the array when the coprocess exits.
	local in_fd=${ENGINE[1]} out_fd=${ENGINE[0]} pid=$ENGINE_PID
	printf 'uci\n' >&"$in_fd"
	while IFS= read -r -t 60 line <&"$out_fd"; do
		line=${line%$'\r'}
		case "$line" in
		"id name "*) name=${line#id name } ;;
		uciok)
			printf 'quit\n' >&"$in_fd" || true
			break
			;;
		esac
	done
	exec {in_fd}>&- || true
	# Give it a moment to exit on quit/EOF, then make sure it is gone.
	(sleep 5 && kill -9 "$pid") >/dev/null 2>&1 &
	local killer=$!
	wait "$pid" 2>/dev/null || true
	kill "$killer" 2>/dev/null || true
	wait "$killer" 2>/dev/null || true
	printf '%s\n' "$name"
}

# expect_uci WANT CMD... — fail unless the engine reports "id name WANT".
expect_uci() {
	local want=$1
	shift
	local got
	got=$(uci_id_name "$@")
	[[ "$got" == "$want" ]] || die "$* reports id name '$got', want '$want'"
	say "  ok: $* -> id name $got"
}

# make_tmp: a scratch directory inside ENGINES_DIR (same filesystem, so mv is a rename).
TMPS=()
cleanup() {
	local d
	for d in "${TMPS[@]:-}"; do
		if [[ -n "$d" ]]; then rm -rf "$d"; fi
	done
	return 0 # the exit status stays the script's own
}
trap cleanup EXIT
# make_tmp VAR TAG — sets VAR (not via $(...): the subshell would lose the TMPS entry).
make_tmp() {
	local d
	d=$(mktemp -d "$ENGINES_DIR/.tmp.$2.XXXXXX")
	TMPS+=("$d")
	printf -v "$1" '%s' "$d"
}

need_pkg() { # need_pkg COMMAND PACKAGE...
	command -v "$1" >/dev/null 2>&1 && return 0
	say "installing ${*:2} (for $1)"
	apt-get install -y -q "${@:2}" >/dev/null || {
		apt-get update -q >/dev/null
		apt-get install -y -q "${@:2}" >/dev/null
	}
}

sf17_native_ok() { [[ -x "$SF17_DIR/stockfish" ]]; }
sf17_wasm_ok() { [[ -x "$SF17_DIR/stockfish-wasm" && -d "$SF17_DIR/wasm" ]]; }
sf15_ok() { [[ -x "$SF15_DIR/stockfish" ]]; }

# Fast path: everything present, nothing to do (this must stay well under a second).
if [[ $VERIFY == 0 ]] && sf17_native_ok && sf17_wasm_ok && sf15_ok; then
	say "all engines present in $ENGINES_DIR"
	exit 0
fi

mkdir -p "$ENGINES_DIR" "$SF17_DIR" "$SF15_DIR" "$DL_DIR"

# One installer at a time per engines dir (parallel CI jobs on one machine share it).
# Under the lock, temp dirs left by a run that was killed outright are stale: remove them.
exec 9>"$ENGINES_DIR/.lock"
if ! flock -n 9; then
	say "another install is running in $ENGINES_DIR; waiting for it"
	flock 9
fi
if [[ $VERIFY == 0 ]] && sf17_native_ok && sf17_wasm_ok && sf15_ok; then
	say "all engines present in $ENGINES_DIR (installed by a concurrent run)"
	exit 0
fi
rm -rf "$ENGINES_DIR"/.tmp.*

# ---------------------------------------------------------------------------
# Stockfish 17.1 native, from Debian trixie's source package.
# ---------------------------------------------------------------------------

# pick_arch — the Stockfish Makefile ARCH for this CPU. AVX2 (+BMI2) rather than AVX-512:
# the 512-bit builds are often no faster, and slower where wide vectors lower the clock.
# BMI2's pext is microcoded (very slow) on AMD before Zen 3 (family 0x17 and older).
pick_arch() {
	if [[ -n "${CHESSD_SF_ARCH:-}" ]]; then
		printf '%s\n' "$CHESSD_SF_ARCH"
		return
	fi
	local flags vendor family
	flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
	vendor=$(grep -m1 '^vendor_id' /proc/cpuinfo | awk '{print $3}')
	family=$(grep -m1 '^cpu family' /proc/cpuinfo | awk '{print $4}')
	has() { [[ "$flags" == *" $1 "* ]]; }
	if [[ $(uname -m) != x86_64 ]]; then
		printf 'general-64\n'
	elif has avx2 && has bmi2 && ! [[ $vendor == AuthenticAMD && ${family:-0} -lt 25 ]]; then
		printf 'x86-64-bmi2\n'
	elif has avx2; then
		printf 'x86-64-avx2\n'
	elif has sse4_1 && has popcnt; then
		printf 'x86-64-sse41-popcnt\n'
	else
		printf 'x86-64\n'
	fi
}

apt_private() { # apt-get with a private sources list, index, cache: the system's apt is untouched
	apt-get -q \
		-o Dir::Etc::SourceList="$APT_DIR/sources.list" \
		-o Dir::Etc::SourceParts=/dev/null \
		-o Dir::State::Lists="$APT_DIR/lists" \
		-o Dir::Cache="$APT_DIR/cache" \
		-o APT::Get::List-Cleanup=0 \
		-o APT::Sandbox::User=root \
		"$@"
}

# stockfish_checksums — "SHA256 SIZE NAME" lines of the Checksums-Sha256 field of source
# package stockfish in the trixie Sources index that apt-get update fetched (signed via
# InRelease). apt may keep the index compressed (lz4/gz/xz); apt-helper cat-file reads any.
stockfish_checksums() {
	local idx
	idx=$(find "$APT_DIR/lists" -maxdepth 1 -name '*trixie_main_source_Sources*' | head -n1)
	[[ -n "$idx" ]] || die "no trixie Sources index in $APT_DIR/lists"
	/usr/lib/apt/apt-helper cat-file "$idx" | awk '
		/^Package: / { inpkg = ($2 == "stockfish") }
		/^$/ { inpkg = 0; insum = 0 }
		inpkg && /^[A-Za-z0-9-]+:/ { insum = ($1 == "Checksums-Sha256:"); next }
		inpkg && insum && NF == 3 { print $1, $2, $3 }
	'
}

install_sf17_native() {
	say "sf-17.1 native: fetching Debian trixie source package stockfish"
	mkdir -p "$APT_DIR/lists/partial" "$APT_DIR/cache/archives/partial"
	printf 'deb-src http://deb.debian.org/debian trixie main\n' >"$APT_DIR/sources.list"
	if [[ -z $(find "$APT_DIR/lists" -maxdepth 1 -name '*trixie_main_source_Sources*' | head -n1) ]]; then
		apt_private update >/dev/null
	fi
	local sums orig want
	sums=$(stockfish_checksums)
	orig=$(awk '$3 ~ /^stockfish_.*\.orig\.tar\./ { print $3; exit }' <<<"$sums")
	want=$(awk '$3 ~ /^stockfish_.*\.orig\.tar\./ { print $1; exit }' <<<"$sums")
	[[ -n "$orig" ]] || die "package stockfish (orig tarball) not found in the trixie Sources index"
	[[ ${#want} == 64 ]] || die "no SHA-256 for $orig in the trixie Sources index"

	if [[ -f "$DL_DIR/$orig" ]] && [[ $(sha256sum "$DL_DIR/$orig" | cut -d' ' -f1) == "$want" ]]; then
		say "  $orig already downloaded and verified"
	else
		need_pkg dpkg-source dpkg-dev
		local dl
		make_tmp dl dl
		# The .dsc answers 404 on this mirror while both tarballs arrive, so apt exits
		# non-zero and cannot verify the set: ignore its status and check the orig
		# tarball against the signed index ourselves below.
		(cd "$dl" && apt_private source --download-only stockfish >"$dl/apt.log" 2>&1) || true
		[[ -f "$dl/$orig" ]] || {
			cat "$dl/apt.log" >&2
			die "apt-get source did not deliver $orig"
		}
		local got
		got=$(sha256sum "$dl/$orig" | cut -d' ' -f1)
		[[ "$got" == "$want" ]] || die "SHA-256 mismatch for $orig: got $got, Sources index says $want"
		mv -f "$dl/$orig" "$DL_DIR/$orig"
		say "  $orig verified (sha256 $want)"
	fi

	local arch build start
	arch=$(pick_arch)
	make_tmp build sf17
	tar -xzf "$DL_DIR/$orig" -C "$build"
	local src
	src=$(find "$build" -mindepth 1 -maxdepth 1 -type d | head -n1)
	[[ -f "$src/src/Makefile" ]] || die "unexpected layout in $orig"
	need_pkg g++ g++
	need_pkg make make
	say "sf-17.1 native: building ARCH=$arch with $JOBS jobs (about a minute)"
	start=$SECONDS
	make -C "$src/src" -j"$JOBS" build ARCH="$arch" >"$build/build.log" 2>&1 || {
		tail -n 30 "$build/build.log" >&2
		die "stockfish build failed (full log was in $build/build.log)"
	}
	say "  built in $((SECONDS - start)) s"
	expect_uci "Stockfish 17.1" "$src/src/stockfish"
	cp "$src/src/stockfish" "$build/stockfish.new"
	printf '%s\n' "$arch" >"$SF17_DIR/ARCH"
	mv -f "$build/stockfish.new" "$SF17_DIR/stockfish"
}

# ---------------------------------------------------------------------------
# Stockfish 17.1 lite WebAssembly, from the npm registry.
# ---------------------------------------------------------------------------
install_sf17_wasm() {
	say "sf-17.1 wasm: $NPM_SPEC from npm"
	need_pkg node nodejs
	need_pkg npm npm
	local tgz="$DL_DIR/stockfish-17.1.0.tgz"
	if [[ ! -f "$tgz" ]]; then
		local dl
		make_tmp dl npm
		# npm checks the tarball against the registry's sha512 integrity field.
		(cd "$dl" && npm pack --silent "$NPM_SPEC" >/dev/null)
		mv -f "$dl"/stockfish-17.1.0.tgz "$tgz"
	else
		say "  $(basename "$tgz") already downloaded"
	fi
	local work
	make_tmp work wasm
	tar -xzf "$tgz" -C "$work" --wildcards 'package/src/stockfish-17.1-lite-single-*' package/Copying.txt package/AUTHORS
	local js
	js=$(find "$work/package/src" -name 'stockfish-17.1-lite-single-*.js' | head -n1)
	[[ -n "$js" && -f "${js%.js}.wasm" ]] || die "lite-single .js/.wasm not found in $NPM_SPEC"
	mkdir "$work/wasm"
	mv "$js" "${js%.js}.wasm" "$work/package/Copying.txt" "$work/package/AUTHORS" "$work/wasm/"
	local jsname
	jsname=$(basename "$js")
	# The launcher resolves its own directory so the engines dir can move.
	cat >"$work/stockfish-wasm" <<EOF
#!/bin/sh
# Stockfish 17.1 lite (single-threaded WebAssembly) as a UCI process on stdin/stdout.
exec node "\$(dirname "\$0")/wasm/$jsname" "\$@"
EOF
	chmod 755 "$work/stockfish-wasm"
	# Replace wasm/ first, then the launcher: the launcher is what marks completion.
	rm -f "$SF17_DIR/stockfish-wasm"
	rm -rf "$SF17_DIR/wasm"
	mv "$work/wasm" "$SF17_DIR/wasm"
	mv -f "$work/stockfish-wasm" "$SF17_DIR/stockfish-wasm.new"
	expect_uci "Stockfish 17.1 Lite WASM" "$SF17_DIR/stockfish-wasm.new"
	mv -f "$SF17_DIR/stockfish-wasm.new" "$SF17_DIR/stockfish-wasm"
}

# ---------------------------------------------------------------------------
# Stockfish 15.1, Debian bookworm's binary package (the system's own distribution).
# ---------------------------------------------------------------------------
install_sf15() {
	say "sf-15.1: Debian bookworm binary package stockfish"
	local deb
	deb=$(find "$DL_DIR" -maxdepth 1 -name 'stockfish_15.1-*.deb' | head -n1)
	if [[ -z "$deb" ]]; then
		# Capture first: "grep -q" exiting early would SIGPIPE apt-cache and, under
		# pipefail, make the test fail even when the candidate is there.
		local policy
		policy=$(apt-cache policy stockfish 2>/dev/null || true)
		if [[ "$policy" != *"Candidate: 15.1"* ]]; then
			say "  apt-get update (stockfish 15.1 not in the apt lists yet)"
			apt-get update -q >/dev/null
		fi
		local dl
		make_tmp dl deb
		# apt-get download checks the .deb against the signed bookworm index.
		(cd "$dl" && apt-get download -q stockfish >/dev/null 2>"$dl/apt.log") || {
			cat "$dl/apt.log" >&2
			die "apt-get download stockfish failed"
		}
		deb=$(find "$dl" -maxdepth 1 -name 'stockfish_*.deb' | head -n1)
		[[ -n "$deb" ]] || die "apt-get download produced no .deb"
		mv -f "$deb" "$DL_DIR/"
		deb="$DL_DIR/$(basename "$deb")"
	else
		say "  $(basename "$deb") already downloaded"
	fi
	local work
	make_tmp work sf15
	dpkg-deb -x "$deb" "$work/root"
	[[ -x "$work/root/usr/games/stockfish" ]] || die "usr/games/stockfish missing from $deb"
	expect_uci "Stockfish 15.1" "$work/root/usr/games/stockfish"
	cp "$work/root/usr/games/stockfish" "$work/stockfish"
	mv -f "$work/stockfish" "$SF15_DIR/stockfish"
}

if sf17_native_ok; then
	say "sf-17.1 native present"
	if [[ $VERIFY == 1 ]]; then expect_uci "Stockfish 17.1" "$SF17_DIR/stockfish"; fi
else
	install_sf17_native
fi
if sf17_wasm_ok; then
	say "sf-17.1 wasm present"
	if [[ $VERIFY == 1 ]]; then expect_uci "Stockfish 17.1 Lite WASM" "$SF17_DIR/stockfish-wasm"; fi
else
	install_sf17_wasm
fi
if sf15_ok; then
	say "sf-15.1 present"
	if [[ $VERIFY == 1 ]]; then expect_uci "Stockfish 15.1" "$SF15_DIR/stockfish"; fi
else
	install_sf15
fi
say "done: engines in $ENGINES_DIR"
