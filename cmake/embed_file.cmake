# cmake -DIN=FILE -DOUT=FILE.c -DNAME=SYMBOL -P embed_file.cmake: FILE's bytes as
# `const unsigned char SYMBOL[]` and `const size_t SYMBOL_len` in a C source.
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" n)
math(EXPR len "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" bytes "${bytes}")
file(WRITE "${OUT}.tmp" "/* generated from ${IN} by cmake/embed_file.cmake */\n#include <stddef.h>\n"
  "const unsigned char ${NAME}[] = {\n${bytes}0};\nconst size_t ${NAME}_len = ${len};\n")
file(RENAME "${OUT}.tmp" "${OUT}")
