# Build and install pagefold for C programs and system use:
#
#   make                      build everything (cargo, release)
#   make install PREFIX=/usr/local DESTDIR=
#       bin/pagefold, lib/libpagefold.so, lib/libpagefold_preload.so,
#       include/pagefold.h, lib/pkgconfig/pagefold.pc
#   make uninstall PREFIX=... DESTDIR=...
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

.PHONY: all install uninstall

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
