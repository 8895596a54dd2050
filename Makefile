# Build and install pagefold for C programs and system use:
#
#   make                      build everything (cargo, release)
#   make install PREFIX=/usr/local DESTDIR=
#       bin/pagefold, lib/libpagefold.so, lib/libpagefold_preload.so,
#       include/pagefold.h, lib/pkgconfig/pagefold.pc
#   make uninstall PREFIX=... DESTDIR=...
#   make deb                  a Debian package of the same files under /usr (builds as install does):
#       $(DEB_DIR)/pagefold_VERSION_ARCH.deb (dpkg-deb, no other tool)
#
# A C program then builds with: cc prog.c $(pkg-config --cflags --libs pagefold)

PREFIX ?= /usr/local
DESTDIR ?=
CARGO ?= cargo
TARGET ?= target/release
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)

BIN := $(DESTDIR)$(PREFIX)/bin
LIB := $(DESTDIR)$(PREFIX)/lib
INC := $(DESTDIR)$(PREFIX)/include
PC := $(LIB)/pkgconfig

DEB_DIR ?= target/debian
DEB_ARCH := $(shell dpkg --print-architecture 2>/dev/null)
DEB_ROOT := $(DEB_DIR)/root

.PHONY: all install uninstall deb

all:
	$(CARGO) build --release -p pagefold -p pagefold-preload -p pagefold-capi

install: all
	install -d $(BIN) $(LIB) $(INC) $(PC)
	install -m 755 $(TARGET)/pagefold $(BIN)/pagefold
	install -m 755 $(TARGET)/libpagefold.so $(LIB)/libpagefold.so
	install -m 755 $(TARGET)/libpagefold_preload.so $(LIB)/libpagefold_preload.so
	install -m 644 crates/capi/include/pagefold.h $(INC)/pagefold.h
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' \
	    crates/capi/pagefold.pc.in > $(PC)/pagefold.pc
	chmod 644 $(PC)/pagefold.pc

uninstall:
	rm -f $(BIN)/pagefold $(LIB)/libpagefold.so $(LIB)/libpagefold_preload.so \
	      $(INC)/pagefold.h $(PC)/pagefold.pc

deb:
	rm -rf $(DEB_ROOT)
	$(MAKE) --no-print-directory install PREFIX=/usr DESTDIR=$(abspath $(DEB_ROOT)) \
	    TARGET=$(TARGET) CARGO=$(CARGO)
	install -d $(DEB_ROOT)/DEBIAN
	sed -e 's|@VERSION@|$(VERSION)|g' -e 's|@ARCH@|$(DEB_ARCH)|g' \
	    -e 's|@SIZE@|'"$$(du -sk $(DEB_ROOT)/usr | cut -f1)"'|g' \
	    packaging/debian/control.in > $(DEB_ROOT)/DEBIAN/control
	dpkg-deb --root-owner-group --build $(DEB_ROOT) \
	    $(DEB_DIR)/pagefold_$(VERSION)_$(DEB_ARCH).deb
