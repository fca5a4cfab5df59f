"""What a relocatable ELF object (``.o``) defines, refers to, and runs at load and exit, read without a linker.

:func:`read_object` reads an x86-64 (ELF64, little-endian) object file: the
global symbols it defines and those it leaves undefined, and its global
constructors and destructors, the entries of its ``.init_array``/``.ctors``
and ``.fini_array``/``.dtors`` sections. A linker that makes an executable or a
shared object puts these in the output's init and fini arrays, which the
dynamic loader runs; LLVM's JIT linker, which links an object into memkernel's
process (see :mod:`memkernel.load.foreign`), runs none. So the object is given
one global symbol per entry, ``__memkernel_init_<i>`` and
``__memkernel_fini_<i>`` (:meth:`Relocatable.with_entry_symbols`), whose
addresses the JIT then gives, in the order to call them:

- constructors by ascending priority (``.init_array.N``/``.ctors.N`` before
  those without a number, which are 65535), an ``.init_array`` section's
  entries in order and a ``.ctors`` section's in reverse, as GNU ld lays them out;
- destructors by descending priority, a ``.fini_array`` section's entries in
  reverse and a ``.dtors`` section's in order.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")
_SECTION = struct.Struct("<IIQQQQIIQQ")
_SYMBOL = struct.Struct("<IBBHQQ")
_RELA = struct.Struct("<QQq")
_REL = struct.Struct("<QQ")

ELF_MAGIC = b"\x7fELF"
RELOCATABLE, SHARED = 1, 3  # e_type: ET_REL, ET_DYN
_X86_64 = 62
_SHT_SYMTAB, _SHT_RELA, _SHT_REL, _SHT_SYMTAB_SHNDX = 2, 4, 9, 18
_SHN_UNDEF, _SHN_LORESERVE = 0, 0xFF00
_STB_GLOBAL, _STB_WEAK, _STB_GNU_UNIQUE = 1, 2, 10
_STT_FUNC, _STT_SECTION, _STT_FILE = 2, 3, 4
_R_X86_64_64 = 1
_DEFAULT_PRIORITY = 65535

INIT_PREFIX = "__memkernel_init_"
FINI_PREFIX = "__memkernel_fini_"


class ElfError(ValueError):
    """An object file memkernel cannot read: not ELF64 x86-64, or laid out in a way it does not handle."""


@dataclass(frozen=True)
class _Entry:
    """One constructor or destructor: at ``value`` in section ``section`` of the object."""

    section: int
    value: int


@dataclass(frozen=True)
class Relocatable:
    """A relocatable object: its bytes, the global symbols it defines and leaves undefined, its constructors
    and destructors in the order to call them."""

    code: bytes
    defined: frozenset[str]
    undefined: frozenset[str]
    constructors: tuple[_Entry, ...]
    destructors: tuple[_Entry, ...]
    _symbol_table: int
    _string_table: int

    @property
    def constructor_symbols(self) -> tuple[str, ...]:
        """The symbols :meth:`with_entry_symbols` gives the constructors, in the order to call them."""
        return tuple(f"{INIT_PREFIX}{i}" for i in range(len(self.constructors)))

    @property
    def destructor_symbols(self) -> tuple[str, ...]:
        """The symbols :meth:`with_entry_symbols` gives the destructors, in the order to call them."""
        return tuple(f"{FINI_PREFIX}{i}" for i in range(len(self.destructors)))

    def with_entry_symbols(self) -> bytes:
        """The object with one more global function symbol per constructor and destructor (see the module's
        documentation): the symbol and string tables are copied, grown, to the end of the file."""
        if not self.constructors and not self.destructors:
            return self.code
        data = bytearray(self.code)
        header = _HEADER.unpack_from(data)
        shoff, shentsize = header[6], header[11]
        symtab = list(_SECTION.unpack_from(data, shoff + self._symbol_table * shentsize))
        strtab = list(_SECTION.unpack_from(data, shoff + self._string_table * shentsize))
        strings = bytearray(data[strtab[4]:strtab[4] + strtab[5]])
        symbols = bytearray(data[symtab[4]:symtab[4] + symtab[5]])
        named = [*zip(self.constructor_symbols, self.constructors), *zip(self.destructor_symbols, self.destructors)]
        for name, entry in named:
            offset = len(strings)
            strings += name.encode() + b"\0"
            symbols += _SYMBOL.pack(offset, (_STB_GLOBAL << 4) | _STT_FUNC, 0, entry.section, entry.value, 0)
        for section, table, content in ((self._string_table, strtab, strings), (self._symbol_table, symtab, symbols)):
            data += b"\0" * (-len(data) % 8)
            table[4], table[5] = len(data), len(content)
            data += content
            _SECTION.pack_into(data, shoff + section * shentsize, *table)
        return bytes(data)


def elf_type(head: bytes) -> int | None:
    """The ELF file type (``e_type``) of a file that starts with ``head`` (at least 18 bytes), None if it is
    not ELF."""
    return int.from_bytes(head[16:18], "little") if head.startswith(ELF_MAGIC) and len(head) >= 18 else None


def read_object(code: bytes) -> Relocatable:
    """Read the relocatable object ``code``; ElfError if it is not one memkernel can read."""
    try:
        return _read(code)
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise ElfError(f"it is not a well-formed ELF object file ({exc})") from None


def _read(code: bytes) -> Relocatable:
    header = _HEADER.unpack_from(code)
    ident, machine, shoff, shentsize, shnum = header[0], header[2], header[6], header[11], header[12]
    if ident[4] != 2 or ident[5] != 1 or machine != _X86_64 or elf_type(code) != RELOCATABLE:
        raise ElfError("it is not an x86-64 (ELF64, little-endian) relocatable object file")
    if shnum == 0 or shentsize != _SECTION.size:
        raise ElfError("it has no section headers memkernel can read (extended section numbering)")
    sections = [_SECTION.unpack_from(code, shoff + i * shentsize) for i in range(shnum)]
    names = sections[header[13]]

    def name_in(table: tuple[int, ...], offset: int) -> str:
        start = table[4] + offset
        return code[start:code.index(b"\0", start)].decode()

    section_names = [name_in(names, s[0]) for s in sections]
    if any(s[1] == _SHT_SYMTAB_SHNDX for s in sections):
        raise ElfError("it has more sections than its symbol table can number (SHT_SYMTAB_SHNDX)")
    tables = [i for i, s in enumerate(sections) if s[1] == _SHT_SYMTAB]
    if len(tables) != 1:
        raise ElfError(f"it has {len(tables)} symbol tables, not one")
    symtab = sections[tables[0]]
    strtab = sections[symtab[6]]
    symbols = [_SYMBOL.unpack_from(code, symtab[4] + i * _SYMBOL.size) for i in range(symtab[5] // _SYMBOL.size)]
    defined, undefined = set(), set()
    for st_name, info, _, shndx, _, _ in symbols:
        if info >> 4 in (_STB_GLOBAL, _STB_WEAK, _STB_GNU_UNIQUE) and info & 0xF not in (_STT_SECTION, _STT_FILE):
            name = name_in(strtab, st_name)
            if shndx != _SHN_UNDEF:
                defined.add(name)
            elif info >> 4 != _STB_WEAK and name:
                undefined.add(name)
    constructors: list[tuple[int, int, _Entry]] = []
    destructors: list[tuple[int, int, _Entry]] = []
    for index, name in enumerate(section_names):
        kind, _, number = name.lstrip(".").partition(".")
        if kind not in ("init_array", "ctors", "fini_array", "dtors"):
            continue
        priority = int(number) if number.isdigit() else _DEFAULT_PRIORITY
        if kind in ("ctors", "dtors") and number.isdigit():
            priority = _DEFAULT_PRIORITY - priority  # GCC names .ctors.N for priority 65535 - N
        entries = _entries(code, sections, symbols, index, name)
        if kind in ("ctors", "fini_array"):  # the loader runs these from the end
            entries.reverse()
        listed = constructors if kind in ("init_array", "ctors") else destructors
        listed += [(priority, len(listed), entry) for entry in entries]
    constructors.sort(key=lambda e: (e[0], e[1]))
    destructors.sort(key=lambda e: (-e[0], e[1]))
    return Relocatable(code, frozenset(defined), frozenset(undefined), tuple(e for _, _, e in constructors),
                       tuple(e for _, _, e in destructors), tables[0], symtab[6])


def _entries(code: bytes, sections: list[tuple[int, ...]], symbols: list[tuple[int, ...]], index: int,
             name: str) -> list[_Entry]:
    """The functions an init or fini section's slots point at, in slot order, read from its relocations."""
    slots: dict[int, _Entry] = {}
    for section in sections:
        if section[1] not in (_SHT_RELA, _SHT_REL) or section[7] != index:
            continue
        size = _RELA.size if section[1] == _SHT_RELA else _REL.size
        for at in range(section[4], section[4] + section[5], size):
            if section[1] == _SHT_RELA:
                offset, info, addend = _RELA.unpack_from(code, at)
            else:
                offset, info = _REL.unpack_from(code, at)
                addend = int.from_bytes(code[sections[index][4] + offset:][:8], "little", signed=True)
            if info & 0xFFFFFFFF != _R_X86_64_64:
                raise ElfError(f"its {name} has a relocation of type {info & 0xFFFFFFFF}, not R_X86_64_64")
            _, _, _, shndx, value, _ = symbols[info >> 32]
            if shndx == _SHN_UNDEF or shndx >= _SHN_LORESERVE:
                raise ElfError(f"its {name} calls a function it does not define")
            slots[offset] = _Entry(shndx, value + addend)
    return [slots[offset] for offset in sorted(slots)]
