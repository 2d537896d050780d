# lib.mk: compile C sources into one static library, in parallel (make -j), out of tree.
# Used by scripts/deps.sh for lwIP and inih; mbedTLS uses its own CMake build.
#   make -f scripts/deps/lib.mk -jN LIB=out.a SRCDIR=dir OBJDIR=dir SRCS="a.c b/c.c" \
#        CC=gcc CFLAGS="..."
OBJS := $(patsubst %.c,$(OBJDIR)/%.o,$(SRCS))

$(LIB): $(OBJS)
	@rm -f $@
	$(AR) rcs $@ $^

$(OBJDIR)/%.o: $(SRCDIR)/%.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -c $< -o $@
