# A Rust symbol name without what changes with the toolchain, lock file, flags and
# features, for linker.sh and generate.sh (sed -E). Legacy names end in a hash
# (`17h` + 16 hex digits + `E`); v0 names (the standard library's) carry crate
# disambiguators (`Cs…_`) and back-references by byte offset (`B…_`), which move
# when a disambiguator's length does. Two functions may end up with one name here:
# both are then listed, which costs a few bytes of packing, never a wrong link.
s/17h[0-9a-f]{16}E$/E/
/^_R/ s/Cs[0-9A-Za-z]+_/C_/g
/^_R/ s/B[0-9A-Za-z]*_/B_/g
