/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * SR-IOV pieces that need no SR-IOV device: the Virtualization Management and Namespace
 * Attachment commands as built, the sysfs side of pci/sriov.h on a fake machine, the VF token's
 * text, a group file handed to vfio/type1.h (checked, and owned on failure too), and the
 * controller calls refusing a controller without Virtualization Management or Namespace
 * Management before anything is sent. The device side runs in the guest (served_vf).
 */
#include <upcie/base/feature.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <upcie/nvme/cmd.h>
#include <upcie/nvme/ctrl.h>
#include <upcie/pci/sriov.h>
#include <upcie/served/client.h>
#include <upcie/served/server.h>
#include <upcie/vfio/type1.h>

#include "check.h"
#include "fake_machine.h"
#include "nvme_ctrl_rig.h"

static void test_cmds(void)
{
	struct upcie_nvme_sqe sqe;

	CHECK_EQ(upcie_nvme_cmd_virt_mgmt(&sqe, UPCIE_NVME_VIRT_SEC_ASSIGN, UPCIE_NVME_VIRT_RT_VI,
					  0x1234, 7),
		 0, "Virtualization Management built");
	CHECK(sqe.opc == 0x1c && sqe.cdw10 == (0x8u | (1u << 8) | (0x1234u << 16)) &&
		  sqe.cdw11 == 7 && sqe.nsid == 0,
	      "opcode 1Ch, ACT 8 RT 1 CNTLID 1234h in CDW10, NR 7 in CDW11 (0x%08x 0x%08x)",
	      sqe.cdw10, sqe.cdw11);
	CHECK_EQ(upcie_nvme_cmd_virt_mgmt(&sqe, 0x10, 0, 1, 1), -EINVAL, "ACT over 4 bits refused");
	CHECK_EQ(upcie_nvme_cmd_virt_mgmt(&sqe, 1, 8, 1, 1), -EINVAL, "RT over 3 bits refused");
	CHECK(upcie_nvme_cmd_ns_attach(&sqe, 2, true) == 0 && sqe.opc == 0x15 && sqe.nsid == 2 &&
		  sqe.cdw10 == 0,
	      "Namespace Attachment, attach: SEL 0");
	CHECK(upcie_nvme_cmd_ns_attach(&sqe, 2, false) == 0 && sqe.cdw10 == 1,
	      "Namespace Attachment, detach: SEL 1");
	CHECK_EQ(upcie_nvme_cmd_ns_attach(&sqe, 0, true), -EINVAL, "NSID 0 refused");
	CHECK_EQ(upcie_nvme_cmd_ns_attach(&sqe, UPCIE_NVME_NSID_ALL, true), -EINVAL,
		 "the broadcast NSID refused");
}

static void read_file(const char *rel, char *buf, size_t len)
{
	char path[1024];

	snprintf(path, sizeof(path), "%s/%s", fm_root, rel);
	buf[0] = '\0';
	upcie_file_read_str(path, buf, len);
}

static void test_sriov_sysfs(void)
{
	struct upcie_pci_bdf pf, plain, vf;
	char buf[64];
	unsigned n = 99;

	fm_machine();
	fm_func("0000:00:0c.0", "0x1b36\n", "0x0010\n", "0x010802\n", "vfio-pci", 7);
	fm_put(FM_DEV "0000:00:0c.0/sriov_totalvfs", "2\n");
	fm_put(FM_DEV "0000:00:0c.0/sriov_numvfs", "0\n");
	upcie_pci_bdf_parse("0000:00:0c.0", &pf);
	upcie_pci_bdf_parse("0000:00:04.0", &plain);
	CHECK(upcie_pci_sriov_total(&pf, &n) == 0 && n == 2, "sriov_totalvfs read: %u", n);
	CHECK_EQ(upcie_pci_sriov_total(&plain, &n), -EOPNOTSUPP,
		 "a function without SR-IOV: -EOPNOTSUPP");
	CHECK_EQ(upcie_pci_sriov_set(&pf, 3), -ERANGE, "3 VFs of 2: -ERANGE");
	read_file(FM_DEV "0000:00:0c.0/sriov_numvfs", buf, sizeof(buf));
	CHECK(!strcmp(buf, "0"), "... and sriov_numvfs untouched (%s)", buf);
	CHECK_EQ(upcie_pci_sriov_set(&pf, 2), 0, "2 VFs enabled");
	read_file(FM_DEV "0000:00:0c.0/sriov_numvfs", buf, sizeof(buf));
	CHECK(!strcmp(buf, "2"), "sriov_numvfs written: %s", buf);
	CHECK_EQ(upcie_pci_sriov_set(&plain, 1), -EOPNOTSUPP, "enabling VFs of a plain function");
	CHECK_EQ(upcie_pci_sriov_vf(&pf, 0, &vf), -ENOENT, "no virtfn0 link: -ENOENT");
	fm_func("0000:00:0c.1", "0x1b36\n", "0x0010\n", "0x010802\n", "vfio-pci", 8);
	fm_link("../0000:00:0c.1", FM_DEV "0000:00:0c.0/virtfn0");
	CHECK(upcie_pci_sriov_vf(&pf, 0, &vf) == 0 && vf.dev == 0xc && vf.fn == 1,
	      "VF 0 is 0000:00:0c.1 (%02x.%x)", vf.dev, vf.fn);
	/* a link the kernel never makes: what it names must be an address */
	fm_link("../nonsense", FM_DEV "0000:00:0c.0/virtfn1");
	CHECK(upcie_pci_sriov_vf(&pf, 1, &vf) < 0, "a virtfn link to no address is refused");
	fm_rm(FM_DEV "0000:00:0c.0/sriov_numvfs");
	CHECK_EQ(upcie_pci_sriov_set(&pf, 1), -EOPNOTSUPP,
		 "sriov_numvfs gone (no SR-IOV capability after all): -EOPNOTSUPP");
	fm_cleanup();
}

static void test_token(void)
{
	const uint8_t u[16] = { 0x2a, 0xb7, 0x49, 0x24, 0xc3, 0x35, 0x45, 0xf4,
				0x9b, 0x16, 0x85, 0x69, 0xe5, 0xb0, 0x82, 0x58 };
	char s[UPCIE_VFIO_VF_TOKEN_STRLEN];

	upcie_vfio_vf_token_format(u, s);
	CHECK(!strcmp(s, "2ab74924-c335-45f4-9b16-8569e5b08258"), "VF token as text: %s", s);
}

static bool fd_open(int fd)
{
	return fcntl(fd, F_GETFD) != -1;
}

static void test_group_adopt(void)
{
	struct upcie_vfio_container c;
	struct upcie_vfio_group g;
	struct upcie_nvme_dev_opts o;
	struct upcie_served_vf vf;
	int fd;

	memset(&c, 0, sizeof(c));
	c.fd = open("/dev/null", O_RDWR | O_CLOEXEC); /* never reached: the file check is first */
	fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	CHECK_EQ(upcie_vfio_group_adopt(&g, &c, 12345, fd), -EINVAL,
		 "a file that is not /dev/vfio/12345 is refused");
	CHECK(!fd_open(fd) && g.fd == -1, "... and closed: the handle owned it from the call on");
	CHECK_EQ(upcie_vfio_group_adopt(&g, &c, 1, -1), -EBADF, "no file: -EBADF");
	fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	CHECK_EQ(upcie_vfio_group_adopt(&g, NULL, 1, fd), -EINVAL, "no container: -EINVAL");
	CHECK(!fd_open(fd), "... and the file closed");
	close(c.fd);
	memset(&vf, 0, sizeof(vf));
	vf.group_fd = 42;
	snprintf(vf.token, sizeof(vf.token), "2ab74924-c335-45f4-9b16-8569e5b08258");
	upcie_served_vf_dev_opts(&vf, &o);
	CHECK(o.path == UPCIE_NVME_PATH_TYPE1 && o.vfio_group_fd == 42 && o.vf_token == vf.token &&
		  vf.group_fd == -1,
	      "a served VF's device options: type1, its group file (handed on), its token");
}

static void test_dev_refuses(void)
{
	struct upcie_nvme_dev_opts o;
	struct upcie_nvme_dev dev;
	struct upcie_pci_bdf bdf;
	int fd;

	fm_machine();
	upcie_pci_bdf_parse("0000:00:07.0", &bdf);
	memset(&o, 0, sizeof(o));
	o.path = UPCIE_NVME_PATH_UIO;
	fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	o.vfio_group_fd = fd;
	CHECK_EQ(upcie_nvme_dev_open(&dev, &bdf, &o), -EINVAL,
		 "a group file on the uio path: -EINVAL");
	CHECK(!fd_open(fd), "... and the group file closed, as promised");
	fm_cleanup();
}

static void test_ctrl_refuses(void)
{
	struct upcie_nvme_pri_ctrl_cap cap;
	struct upcie_nvme_sec_ctrl sc;
	struct rig r;
	uint32_t nsid = 1;
	uint64_t fetched;
	unsigned n;
	bool reset;

	rig_setup(&r);
	if (rig_start(&r) || rig_ctrl(&r, NULL)) {
		CHECK(0, "the model controller came up");
		rig_teardown(&r);
		return;
	}
	CHECK(!(r.c.id.oacs & (UPCIE_NVME_OACS_VIRT | UPCIE_NVME_OACS_NS_MGMT)),
	      "the model has neither Virtualization nor Namespace Management (OACS 0x%x)",
	      r.c.id.oacs);
	fetched = r.cm.admin.fetched;
	CHECK_EQ(upcie_nvme_ctrl_pri_cap(&r.c, &cap), -EOPNOTSUPP,
		 "primary capabilities: -EOPNOTSUPP");
	CHECK_EQ(upcie_nvme_ctrl_sec_list(&r.c, &sc, 1, &n), -EOPNOTSUPP,
		 "secondary list: -EOPNOTSUPP");
	CHECK_EQ(upcie_nvme_ctrl_virt_release_primary(&r.c, &reset), -EOPNOTSUPP,
		 "release primary: -EOPNOTSUPP");
	CHECK_EQ(upcie_nvme_ctrl_sec_online(&r.c, 1, 2, 1), -EOPNOTSUPP,
		 "secondary online: -EOPNOTSUPP");
	CHECK_EQ(upcie_nvme_ctrl_sec_online(&r.c, 1, 1, 1), -EINVAL,
		 "secondary online with 1 queue resource: -EINVAL");
	CHECK_EQ(upcie_nvme_ctrl_ns_attach(&r.c, 1, 2, true), -EOPNOTSUPP,
		 "namespace attach: -EOPNOTSUPP");
	CHECK_EQ(upcie_nvme_ctrl_ns_attach_only(&r.c, 2, &nsid, 1), -EOPNOTSUPP,
		 "attach only: -EOPNOTSUPP");
	CHECK(r.cm.admin.fetched == fetched, "nothing was sent (%llu admin commands fetched since)",
	      (unsigned long long)(r.cm.admin.fetched - fetched));
	rig_teardown(&r);
}

int main(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	upcie_log_set_handler(rig_log, NULL);
	test_cmds();
	test_sriov_sysfs();
	test_token();
	test_group_adopt();
	test_dev_refuses();
	test_ctrl_refuses();
	return check_done();
}
