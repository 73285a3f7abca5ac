// Test data: an hwloc 2 XML machine shared by the topology and workqueue tests.
// Two packages, each with a NUMA node and an L3, two cores of two SMT siblings; the
// siblings are numbered like Intel's (core 0 = CPUs 0 and 4) and CPU 7 is disallowed.
// Node 0 has CPUs 0, 1, 4, 5 and node 1 has 2, 3, 6: an asymmetric machine.

#ifndef KWQ_TESTS_TESTING_TWO_SOCKET_XML_H_
#define KWQ_TESTS_TESTING_TWO_SOCKET_XML_H_

namespace kwq::testing {

inline constexpr char kTwoSocketXml[] = R"(<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE topology SYSTEM "hwloc2.dtd">
<topology version="2.0">
  <object type="Machine" os_index="0" cpuset="0xff" complete_cpuset="0xff" allowed_cpuset="0x7f" nodeset="0x3" complete_nodeset="0x3" allowed_nodeset="0x3" gp_index="1">
    <object type="Package" os_index="0" cpuset="0x33" complete_cpuset="0x33" nodeset="0x1" complete_nodeset="0x1" gp_index="2">
      <object type="NUMANode" os_index="0" cpuset="0x33" complete_cpuset="0x33" nodeset="0x1" complete_nodeset="0x1" gp_index="3" local_memory="1073741824"/>
      <object type="L3Cache" cpuset="0x33" complete_cpuset="0x33" nodeset="0x1" complete_nodeset="0x1" gp_index="4" cache_size="16777216" depth="3" cache_linesize="64" cache_associativity="0" cache_type="0">
        <object type="Core" os_index="0" cpuset="0x11" complete_cpuset="0x11" nodeset="0x1" complete_nodeset="0x1" gp_index="5">
          <object type="PU" os_index="0" cpuset="0x01" complete_cpuset="0x01" nodeset="0x1" complete_nodeset="0x1" gp_index="6"/>
          <object type="PU" os_index="4" cpuset="0x10" complete_cpuset="0x10" nodeset="0x1" complete_nodeset="0x1" gp_index="7"/>
        </object>
        <object type="Core" os_index="1" cpuset="0x22" complete_cpuset="0x22" nodeset="0x1" complete_nodeset="0x1" gp_index="8">
          <object type="PU" os_index="1" cpuset="0x02" complete_cpuset="0x02" nodeset="0x1" complete_nodeset="0x1" gp_index="9"/>
          <object type="PU" os_index="5" cpuset="0x20" complete_cpuset="0x20" nodeset="0x1" complete_nodeset="0x1" gp_index="10"/>
        </object>
      </object>
    </object>
    <object type="Package" os_index="1" cpuset="0xcc" complete_cpuset="0xcc" nodeset="0x2" complete_nodeset="0x2" gp_index="11">
      <object type="NUMANode" os_index="1" cpuset="0xcc" complete_cpuset="0xcc" nodeset="0x2" complete_nodeset="0x2" gp_index="12" local_memory="1073741824"/>
      <object type="L3Cache" cpuset="0xcc" complete_cpuset="0xcc" nodeset="0x2" complete_nodeset="0x2" gp_index="13" cache_size="16777216" depth="3" cache_linesize="64" cache_associativity="0" cache_type="0">
        <object type="Core" os_index="0" cpuset="0x44" complete_cpuset="0x44" nodeset="0x2" complete_nodeset="0x2" gp_index="14">
          <object type="PU" os_index="2" cpuset="0x04" complete_cpuset="0x04" nodeset="0x2" complete_nodeset="0x2" gp_index="15"/>
          <object type="PU" os_index="6" cpuset="0x40" complete_cpuset="0x40" nodeset="0x2" complete_nodeset="0x2" gp_index="16"/>
        </object>
        <object type="Core" os_index="1" cpuset="0x88" complete_cpuset="0x88" nodeset="0x2" complete_nodeset="0x2" gp_index="17">
          <object type="PU" os_index="3" cpuset="0x08" complete_cpuset="0x08" nodeset="0x2" complete_nodeset="0x2" gp_index="18"/>
          <object type="PU" os_index="7" cpuset="0x80" complete_cpuset="0x80" nodeset="0x2" complete_nodeset="0x2" gp_index="19"/>
        </object>
      </object>
    </object>
  </object>
</topology>
)";

}  // namespace kwq::testing

#endif  // KWQ_TESTS_TESTING_TWO_SOCKET_XML_H_
